package tmuxterm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/image/font"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

// UpdateEnv, set to 1, makes Screenshot write the screenshots of docs/ instead of checking them.
const UpdateEnv = "GPE_UPDATE_SCREENSHOTS"

// The fonts of the screenshots: DejaVu Sans Mono, which has every character top draws (Debian's fonts-dejavu-core,
// which scripts/test.sh installs).
const (
	fontRegular = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
	fontBold    = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"
)

// Screenshot holds the terminal's screen against the screenshot at path, a PNG drawn from it with its colours: the
// PNG carries the screen's text, normalized by normalize (a clock's time, an age), and a screen whose text differs
// from it fails the test, so that the screenshots of the docs cannot go stale. With GPE_UPDATE_SCREENSHOTS=1 it
// draws the screen and writes the PNG instead.
func (term *Terminal) Screenshot(path string, normalize func(string) string) {
	term.t.Helper()
	screen := term.Tmux("capture-pane", "-p", "-e", "-t", "top")
	text := normalize(strings.Join(term.Lines(), "\n"))
	if os.Getenv(UpdateEnv) == "1" {
		img, err := render(screen, term.size)
		if err != nil {
			term.t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			term.t.Fatal(err)
		}
		if err := os.WriteFile(path, withText(buf.Bytes(), "screen", text), 0o644); err != nil {
			term.t.Fatal(err)
		}
		term.t.Logf("wrote %s", path)
		return
	}
	old, err := os.ReadFile(path)
	if err != nil {
		term.t.Fatal(err)
	}
	if got, ok := textOf(old, "screen"); !ok || got != text {
		term.t.Errorf("%s is stale: the screen is now\n%s\nand the screenshot shows\n%s\n(%s=1 go test -tags e2e -run %s draws it anew)",
			path, text, got, UpdateEnv, term.t.Name())
	}
}

// size is the window's width and height in cells.
func (term *Terminal) size() (w, h int) {
	w, _ = strconv.Atoi(term.Format("#{pane_width}"))
	h, _ = strconv.Atoi(term.Format("#{pane_height}"))
	return w, h
}

// cell is one character on the screen with its colours.
type cell struct {
	r          rune
	fg, bg     color.Color
	bold, dim  bool
	reverse    bool
	fgSet, set bool
}

var sgr = regexp.MustCompile(`^\x1b\[([0-9;:]*)m`)

// The xterm palette of the 16 colours top uses.
var palette = []color.RGBA{
	{0x1d, 0x1f, 0x21, 255}, {0xcc, 0x44, 0x44, 255}, {0x5f, 0xa8, 0x5f, 255}, {0xd9, 0xa3, 0x3b, 255},
	{0x4f, 0x80, 0xc6, 255}, {0xa3, 0x6a, 0xc0, 255}, {0x3e, 0xa8, 0xa8, 255}, {0xc5, 0xc8, 0xc6, 255},
	{0x66, 0x66, 0x66, 255}, {0xff, 0x5f, 0x5f, 255}, {0x87, 0xd7, 0x5f, 255}, {0xff, 0xd7, 0x5f, 255},
	{0x5f, 0xaf, 0xff, 255}, {0xd7, 0x87, 0xff, 255}, {0x5f, 0xd7, 0xd7, 255}, {0xff, 0xff, 0xff, 255},
}

var (
	background = color.RGBA{0x1d, 0x1f, 0x21, 255}
	foreground = color.RGBA{0xd8, 0xdb, 0xd9, 255}
)

// grid reads a capture-pane -e screen into cells: its characters and the SGR colours and attributes in force.
func grid(screen string, w, h int) [][]cell {
	cells := make([][]cell, h)
	var fg, bg color.Color
	var bold, dim, reverse bool
	for y, line := range strings.Split(strings.TrimSuffix(screen, "\n"), "\n") {
		if y >= h {
			break
		}
		cells[y] = make([]cell, w)
		x := 0
		for len(line) > 0 {
			if m := sgr.FindStringSubmatch(line); m != nil {
				line = line[len(m[0]):]
				params := strings.FieldsFunc(m[1], func(r rune) bool { return r == ';' || r == ':' })
				if len(params) == 0 {
					params = []string{"0"}
				}
				for i := 0; i < len(params); i++ {
					n, _ := strconv.Atoi(params[i])
					switch {
					case n == 0:
						fg, bg, bold, dim, reverse = nil, nil, false, false, false
					case n == 1:
						bold = true
					case n == 2:
						dim = true
					case n == 22:
						bold, dim = false, false
					case n == 7:
						reverse = true
					case n == 27:
						reverse = false
					case n >= 30 && n <= 37:
						fg = palette[n-30]
					case n >= 90 && n <= 97:
						fg = palette[n-90+8]
					case n == 39:
						fg = nil
					case n >= 40 && n <= 47:
						bg = palette[n-40]
					case n >= 100 && n <= 107:
						bg = palette[n-100+8]
					case n == 49:
						bg = nil
					case (n == 38 || n == 48) && i+2 < len(params) && params[i+1] == "5":
						k, _ := strconv.Atoi(params[i+2])
						c := xterm256(k)
						if n == 38 {
							fg = c
						} else {
							bg = c
						}
						i += 2
					case (n == 38 || n == 48) && i+4 < len(params) && params[i+1] == "2":
						r, _ := strconv.Atoi(params[i+2])
						g, _ := strconv.Atoi(params[i+3])
						b, _ := strconv.Atoi(params[i+4])
						c := color.RGBA{uint8(r), uint8(g), uint8(b), 255}
						if n == 38 {
							fg = c
						} else {
							bg = c
						}
						i += 4
					}
				}
				continue
			}
			r, size := utf8.DecodeRuneInString(line)
			line = line[size:]
			if x < w {
				cells[y][x] = cell{r: r, fg: fg, bg: bg, bold: bold, dim: dim, reverse: reverse, set: true}
			}
			x++
		}
	}
	return cells
}

// xterm256 is colour k of xterm's 256.
func xterm256(k int) color.Color {
	switch {
	case k < 16:
		return palette[k]
	case k < 232:
		k -= 16
		level := func(v int) uint8 {
			if v == 0 {
				return 0
			}
			return uint8(55 + v*40)
		}
		return color.RGBA{level(k / 36), level(k / 6 % 6), level(k % 6), 255}
	}
	g := uint8(8 + (k-232)*10)
	return color.RGBA{g, g, g, 255}
}

// render draws a capture-pane -e screen of the window's size.
func render(screen string, size func() (int, int)) (image.Image, error) {
	w, h := size()
	faces := make([]font.Face, 2)
	for i, path := range []string{fontRegular, fontBold} {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, errors.New("the screenshots' font: " + err.Error() + " (Debian package fonts-dejavu-core)")
		}
		f, err := opentype.Parse(b)
		if err != nil {
			return nil, err
		}
		if faces[i], err = opentype.NewFace(f, &opentype.FaceOptions{Size: 13, DPI: 96, Hinting: font.HintingFull}); err != nil {
			return nil, err
		}
	}
	metrics := faces[0].Metrics()
	advance, _ := faces[0].GlyphAdvance('M')
	cw, ch := advance.Ceil(), (metrics.Ascent+metrics.Descent).Ceil()+2
	const margin = 12
	img := image.NewRGBA(image.Rect(0, 0, w*cw+2*margin, h*ch+2*margin))
	draw.Draw(img, img.Bounds(), image.NewUniform(background), image.Point{}, draw.Src)
	for y, row := range grid(screen, w, h) {
		for x, c := range row {
			fg, bg := c.fg, c.bg
			if fg == nil {
				fg = foreground
			}
			if bg == nil {
				bg = background
			}
			if c.reverse {
				fg, bg = bg, fg
			}
			if c.dim {
				r, g, b, _ := fg.RGBA()
				fg = color.RGBA{uint8(r >> 9), uint8(g >> 9), uint8(b >> 9), 255}
			}
			rect := image.Rect(margin+x*cw, margin+y*ch, margin+(x+1)*cw, margin+(y+1)*ch)
			draw.Draw(img, rect, image.NewUniform(bg), image.Point{}, draw.Src)
			if !c.set || c.r == ' ' {
				continue
			}
			face := faces[0]
			if c.bold {
				face = faces[1]
			}
			d := font.Drawer{Dst: img, Src: image.NewUniform(fg), Face: face,
				Dot: fixed.P(margin+x*cw, margin+y*ch+metrics.Ascent.Ceil()+1)}
			d.DrawString(string(c.r))
		}
	}
	return img, nil
}

// withText adds a tEXt chunk to a PNG, after its header.
func withText(p []byte, key, text string) []byte {
	data := append(append([]byte(key), 0), text...)
	chunk := make([]byte, 8, 12+len(data))
	binary.BigEndian.PutUint32(chunk, uint32(len(data)))
	copy(chunk[4:], "tEXt")
	chunk = append(chunk, data...)
	chunk = binary.BigEndian.AppendUint32(chunk, crc32.ChecksumIEEE(chunk[4:]))
	const header = 8 + 8 + 13 + 4 // the signature, then IHDR
	return append(append(append([]byte{}, p[:header]...), chunk...), p[header:]...)
}

// textOf reads a PNG's tEXt chunk of key.
func textOf(p []byte, key string) (string, bool) {
	for i := 8; i+8 <= len(p); {
		n := int(binary.BigEndian.Uint32(p[i:]))
		kind := string(p[i+4 : i+8])
		if i+12+n > len(p) {
			return "", false
		}
		if data := p[i+8 : i+8+n]; kind == "tEXt" && bytes.HasPrefix(data, append([]byte(key), 0)) {
			return string(data[len(key)+1:]), true
		}
		i += 12 + n
	}
	return "", false
}
