package configfile

import (
	"maps"
	"path/filepath"
	"slices"

	"github.com/prometheus/common/config"
)

// HTTPClient reads an HTTP client configuration in promtool's format, and checks each file that it names (password,
// token, secret, header and TLS files), which the client reads itself at each request: a wrong one is refused at
// start, not at the first request, where a FIFO would hang it.
func HTTPClient(path string) (*config.HTTPClientConfig, error) {
	b, err := Read(path, MaxBytes)
	if err != nil {
		return nil, err
	}
	cfg, err := config.LoadHTTPConfig(string(b))
	if err != nil {
		return nil, err
	}
	cfg.SetDirectory(filepath.Dir(path))
	for _, f := range httpClientFiles(cfg) {
		if err := Check(f, MaxBytes); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// httpClientFiles are the files an HTTP client configuration names.
func httpClientFiles(c *config.HTTPClientConfig) []string {
	files := []string{c.BearerTokenFile}
	tls := func(t config.TLSConfig) { files = append(files, t.CAFile, t.CertFile, t.KeyFile) }
	tls(c.TLSConfig)
	if a := c.BasicAuth; a != nil {
		files = append(files, a.UsernameFile, a.PasswordFile)
	}
	if a := c.Authorization; a != nil {
		files = append(files, a.CredentialsFile)
	}
	if o := c.OAuth2; o != nil {
		files = append(files, o.ClientSecretFile, o.ClientCertificateKeyFile)
		tls(o.TLSConfig)
	}
	if h := c.HTTPHeaders; h != nil {
		for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
			files = append(files, h.Headers[name].Files...)
		}
	}
	return slices.DeleteFunc(files, func(f string) bool { return f == "" })
}
