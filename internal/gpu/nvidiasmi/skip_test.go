package nvidiasmi

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestReadElementsAreTheSchemas(t *testing.T) {
	for _, name := range []string{"nvidia_smi_log", "gpu", "pci", "pci_bus_id", "mig_devices", "mig_device", "aggregate",
		"single_bit", "total", "gpu_power_readings", "processes", "process_info", "process_name", "used_memory",
		"clocks_event_reasons", "clocks_throttle_reason_gpu_idle", "clocks_event_reason_display_clocks_setting",
		"clocks_event_reasons_counters_hw_power_brake", "replay_counter", "remapped_row_pending", "max_link_width"} {
		if !readElements[name] {
			t.Errorf("%s is read but would be cut", name)
		}
	}
	for _, name := range []string{"supported_clocks", "accounted_processes", "bar1_memory_usage", "volatile", "id",
		"clocks_event_reason_future_reason", "tx_util", "retired_pagelist", ""} {
		if readElements[name] {
			t.Errorf("%q is not read but would be kept", name)
		}
	}
}

func TestSkipUnread(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`<nvidia_smi_log><gpu id="1"><supported_clocks><x>1</x></supported_clocks><uuid>U</uuid></gpu></nvidia_smi_log>`,
			`<nvidia_smi_log><gpu id="1"><uuid>U</uuid></gpu></nvidia_smi_log>`},
		// Unread elements inside read ones, and empty ones.
		{`<nvidia_smi_log><gpu><ecc_errors><volatile><total>1</total></volatile><aggregate/></ecc_errors><foo/></gpu></nvidia_smi_log>`,
			`<nvidia_smi_log><gpu><ecc_errors><aggregate/></ecc_errors></gpu></nvidia_smi_log>`},
		// The root is never cut, whatever its name: the decoder says what is wrong with it.
		{`<?xml version="1.0" ?><!DOCTYPE x SYSTEM "y"><other><foo>1</foo></other>`, `<?xml version="1.0" ?><!DOCTYPE x SYSTEM "y"><other></other>`},
		// Comments, CDATA and processing instructions pass as they are, tags in them included.
		{`<nvidia_smi_log><!-- <foo> --><![CDATA[<bar>]]><?pi <baz>?></nvidia_smi_log>`, `<nvidia_smi_log><!-- <foo> --><![CDATA[<bar>]]><?pi <baz>?></nvidia_smi_log>`},
		// Elements of the same name nested, and attribute values that hold '>' or "/>", are followed.
		{`<nvidia_smi_log><foo><foo></foo></foo><gpu/></nvidia_smi_log>`, `<nvidia_smi_log><gpu/></nvidia_smi_log>`},
		{`<nvidia_smi_log><foo a="/>" b='>'></foo><gpu/></nvidia_smi_log>`, `<nvidia_smi_log><gpu/></nvidia_smi_log>`},
		// A document whose tags do not nest is left whole, for the decoder to judge.
		{`<nvidia_smi_log><foo></bar></nvidia_smi_log>`, `<nvidia_smi_log><foo></bar></nvidia_smi_log>`},
		{`<nvidia_smi_log><foo>`, `<nvidia_smi_log><foo>`},
		{`<nvidia_smi_log><foo></foo><gpu`, `<nvidia_smi_log><foo></foo><gpu`},
		{`<nvidia_smi_log><foo></foo></nvidia_smi_log></x>`, `<nvidia_smi_log><foo></foo></nvidia_smi_log></x>`},
		{`<nvidia_smi_log><foo></foo>< ></nvidia_smi_log>`, `<nvidia_smi_log><foo></foo>< ></nvidia_smi_log>`},
		// A name that only starts like another is not that element.
		{`<nvidia_smi_log><foo><foobar></foobar></foo><gpu/></nvidia_smi_log>`, `<nvidia_smi_log><gpu/></nvidia_smi_log>`},
	} {
		if got := string(skipUnread([]byte(tc.in))); got != tc.want {
			t.Errorf("skipUnread(%s)\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// Cutting what is not read changes nothing that is: every fixture, cut or not, gives the same snapshot.
func TestSkipUnreadKeepsEveryFixture(t *testing.T) {
	files, err := filepath.Glob("testdata/*.xml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		sameAsFullDecode(t, repair(b))
		if cut := skipUnread(repair(b)); len(cut) >= len(b) && bytes.Contains(b, []byte("<supported_clocks>")) {
			t.Errorf("%s: nothing cut", file)
		}
	}
}

func sameAsFullDecode(t *testing.T, repaired []byte) {
	t.Helper()
	full, fullErr := decode(repaired)
	if fullErr != nil {
		return // the cut may make more documents decode, never fewer or others
	}
	cut, err := decode(skipUnread(repaired))
	if err != nil {
		t.Fatalf("decodes whole, but not cut: %v", err)
	}
	if a, b := render(full), render(cut); a != b {
		t.Fatalf("cut changes the snapshot:\n%s\nwhole:\n%s", b, a)
	}
}

func FuzzSkipUnread(f *testing.F) {
	files, err := filepath.Glob("testdata/*.xml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(compact(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameAsFullDecode(t, repair(b)) })
}
