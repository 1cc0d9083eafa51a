package main

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
)

// logFlags are --log.level and --log.format, with errors that name the flag.
type logFlags struct {
	noChecks
	config promslog.Config
}

func (f *logFlags) register(h flagHost) {
	f.config = promslog.Config{Level: promslog.NewLevel(), Format: promslog.NewFormat()}
	h.Flag(promslogflag.LevelFlagName, promslogflag.LevelFlagHelp).Default("info").
		SetValue(namedValue{flag: promslogflag.LevelFlagName, values: []string{"debug", "info", "warn", "error"}, Value: f.config.Level})
	h.Flag(promslogflag.FormatFlagName, promslogflag.FormatFlagHelp).Default("logfmt").
		SetValue(namedValue{flag: promslogflag.FormatFlagName, values: []string{"logfmt", "json"}, Value: f.config.Format})
}

// serverLogger is the server's log: structured, in the format the flags choose, on stderr.
func (f *logFlags) serverLogger() *slog.Logger { return promslog.New(&f.config) }

// cliLogger is the log of a command for a person: warnings and errors as one plain line each on stderr, and the
// structured log only when --log.level=debug asks for it.
func (f *logFlags) cliLogger(stderr io.Writer) *slog.Logger {
	if f.config.Level.String() == "debug" {
		return promslog.New(&promslog.Config{Level: f.config.Level, Format: f.config.Format, Writer: stderr})
	}
	return slog.New(&humanHandler{w: stderr})
}

// humanHandler writes warnings and errors as "gpu-pod-exporter: warning: message (key value, ...)", escaped for
// the terminal: a runtime's error text or a cgroup path in a message is the node's, not ours.
type humanHandler struct {
	mu    sync.Mutex
	w     io.Writer
	attrs []slog.Attr
}

func (h *humanHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *humanHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("gpu-pod-exporter: warning: ")
	b.WriteString(terminal.Escape(r.Message))
	var details []string
	add := func(a slog.Attr) bool {
		details = append(details, a.Key+" "+a.Value.String())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if len(details) > 0 {
		b.WriteString(" (" + terminal.Escape(strings.Join(details, ", ")) + ")")
	}
	b.WriteString("\n")
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *humanHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &humanHandler{w: h.w, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h *humanHandler) WithGroup(string) slog.Handler { return h }
