package tmuxterm

import (
	"bytes"
	"image"
	"image/png"
	"testing"
)

// A screenshot carries its screen's text in a tEXt chunk that PNG decoders pass over.
func TestScreenshotText(t *testing.T) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewRGBA(image.Rect(0, 0, 4, 3))); err != nil {
		t.Fatal(err)
	}
	p := withText(buf.Bytes(), "screen", "gpu-pod-exporter top  hh:mm:ss\n✗ GPU 6")
	if _, err := png.Decode(bytes.NewReader(p)); err != nil {
		t.Fatalf("the PNG with its text does not decode: %v", err)
	}
	if got, ok := textOf(p, "screen"); !ok || got != "gpu-pod-exporter top  hh:mm:ss\n✗ GPU 6" {
		t.Errorf("text %q, %v", got, ok)
	}
	if _, ok := textOf(buf.Bytes(), "screen"); ok {
		t.Error("a PNG without the text has it")
	}
}

// The screen's colours are read as the terminal shows them.
func TestGrid(t *testing.T) {
	g := grid("\x1b[1mab\x1b[0m\x1b[7mc\n\x1b[38;5;196mx\x1b[39;49m \x1b[91my\n", 4, 2)
	if !g[0][0].bold || g[0][2].bold || !g[0][2].reverse || g[0][3].set || g[1][0].fg == nil || g[1][1].fg != nil || g[1][2].fg != palette[9] {
		t.Errorf("grid %+v", g)
	}
}
