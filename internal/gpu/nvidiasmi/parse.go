// Package nvidiasmi is the GPU source for hosts where NVML cannot be loaded into the exporter but the nvidia-smi
// program works. It runs `nvidia-smi -q -x` and parses the XML of every schema from DTD v9 (driver 384) to v13
// (driver 590+) into the same gpu.Snapshot that the NVML source produces.
//
// Choices the XML forces on us, so that metrics mean the same as with NVML:
//
//   - Index is the position of the <gpu> element in the file. nvidia-smi lists GPUs in its own index order (PCI bus
//     order, as NVML and CUDA_DEVICE_ORDER=PCI_BUS_ID do); <minor_number> is the /dev/nvidiaN number, which differs
//     from the index on some systems and is N/A on Windows.
//   - Power usage is <average_power_draw> when present (v12 on driver 530+ and v13: it is what nvidia-smi's and
//     NVML's "power.draw" report there), else <instant_power_draw>, else the older <power_draw>. Both
//     <power_readings> (up to v12 on old drivers) and <gpu_power_readings> (v12+) are read; module and memory power
//     readings are ignored.
//   - Power limit is the enforced limit: <current_power_limit> (v12+), else <enforced_power_limit>, else
//     <power_limit>.
//   - Process types: C → compute, G → graphics, C+G → compute+graphics, and any type containing M (M, M+C: a
//     process that uses the GPU through an MPS server) → mps. A type we do not know is left empty, not guessed.
//   - Lifetime ECC counts are the <aggregate> counters: single_bit/double_bit totals (v9-v11), or the sum of the
//     SRAM and DRAM counters (v11+, with v13's parity/SEC-DED split of uncorrectable SRAM).
//   - The clock throttle/event reasons (<clocks_throttle_reasons>, renamed <clocks_event_reasons>) are not part of
//     the Snapshot and are not read.
//   - nvidia-smi -q -x gives neither a MIG device's UUID nor its profile name, so MIGInstance.UUID and .Profile are
//     empty; a <uuid> inside <mig_device> is read should a driver ever print one.
//   - Snapshot.Time is left zero by Parse: the <timestamp> has no time zone. The Source sets it.
//
// Every value nvidia-smi prints as N/A, [N/A], [Not Supported], [Insufficient Permissions], "Requested functionality
// has been deprecated", "Unknown Error", or anything else that is not a number in the unit we expect, leaves the
// field invalid. It is never read as 0 and never fails the parse. Utilization percentages above 100 are invalid;
// fan speed may exceed 100 % (NVML documents that) and is kept as reported.
package nvidiasmi

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

const mib = 1 << 20

// xmlLog is the part of nvsmi_device_v9..v13.dtd that the Snapshot needs. Elements of several schema versions live
// side by side; the ones a file lacks stay empty.
type xmlLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	CUDAVersion   string   `xml:"cuda_version"`
	AttachedGPUs  string   `xml:"attached_gpus"`
	GPUs          []xmlGPU `xml:"gpu"`
}

type xmlGPU struct {
	ID               string          `xml:"id,attr"`
	ProductName      string          `xml:"product_name"`
	UUID             string          `xml:"uuid"`
	PCIBusID         string          `xml:"pci>pci_bus_id"`
	MinorNumber      string          `xml:"minor_number"`
	CurrentMIG       string          `xml:"mig_mode>current_mig"`
	MIGDevices       []xmlMIGDevice  `xml:"mig_devices>mig_device"`
	FanSpeed         string          `xml:"fan_speed"`
	PerformanceState string          `xml:"performance_state"`
	FBMemory         xmlMemory       `xml:"fb_memory_usage"`
	Utilization      xmlUtilization  `xml:"utilization"`
	ECCAggregate     xmlECC          `xml:"ecc_errors>aggregate"`
	GPUTemp          string          `xml:"temperature>gpu_temp"`
	PowerReadings    xmlPower        `xml:"power_readings"`     // up to v12 on drivers before 530
	GPUPowerReadings xmlPower        `xml:"gpu_power_readings"` // v12 on 530+, v13
	TotalEnergy      string          `xml:"total_energy_consumption"`
	Clocks           xmlClocks       `xml:"clocks"`
	Processes        *xmlProcessList `xml:"processes"`
}

type xmlMIGDevice struct {
	UUID              string    `xml:"uuid"`
	GPUInstanceID     string    `xml:"gpu_instance_id"`
	ComputeInstanceID string    `xml:"compute_instance_id"`
	FBMemory          xmlMemory `xml:"fb_memory_usage"`
	// The text output names it "Shared FB Memory Usage"; accept that spelling too in case the XML follows.
	SharedFBMemory xmlMemory `xml:"shared_fb_memory_usage"`
}

type xmlMemory struct {
	Total string `xml:"total"`
	Used  string `xml:"used"`
	Free  string `xml:"free"`
}

type xmlUtilization struct {
	GPU     string `xml:"gpu_util"`
	Memory  string `xml:"memory_util"`
	Encoder string `xml:"encoder_util"`
	Decoder string `xml:"decoder_util"`
}

type xmlECC struct {
	SingleBitTotal          string `xml:"single_bit>total"`
	DoubleBitTotal          string `xml:"double_bit>total"`
	SRAMCorrectable         string `xml:"sram_correctable"`
	SRAMUncorrectable       string `xml:"sram_uncorrectable"`
	SRAMUncorrectableParity string `xml:"sram_uncorrectable_parity"`
	SRAMUncorrectableSECDED string `xml:"sram_uncorrectable_secded"`
	DRAMCorrectable         string `xml:"dram_correctable"`
	DRAMUncorrectable       string `xml:"dram_uncorrectable"`
}

type xmlPower struct {
	PowerDraw          string `xml:"power_draw"`
	AveragePowerDraw   string `xml:"average_power_draw"`
	InstantPowerDraw   string `xml:"instant_power_draw"`
	CurrentPowerLimit  string `xml:"current_power_limit"`
	EnforcedPowerLimit string `xml:"enforced_power_limit"`
	PowerLimit         string `xml:"power_limit"`
	TotalEnergy        string `xml:"total_energy_consumption"`
}

type xmlClocks struct {
	Graphics string `xml:"graphics_clock"`
	SM       string `xml:"sm_clock"`
	Memory   string `xml:"mem_clock"`
	Video    string `xml:"video_clock"`
}

type xmlProcessList struct {
	Text      string       `xml:",chardata"`
	Processes []xmlProcess `xml:"process_info"`
}

type xmlProcess struct {
	GPUInstanceID     string `xml:"gpu_instance_id"`
	ComputeInstanceID string `xml:"compute_instance_id"`
	PID               string `xml:"pid"`
	Type              string `xml:"type"`
	Name              string `xml:"process_name"`
	UsedMemory        string `xml:"used_memory"`
}

// Parse reads the output of `nvidia-smi -q -x`. It fails only when the input is not an nvidia_smi_log document;
// a device without a UUID is reported in Snapshot.Errors and left out, and a value that cannot be read leaves its
// field invalid.
func Parse(r io.Reader) (*gpu.Snapshot, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty output")
	}
	dec := xml.NewDecoder(bytes.NewReader(repair(raw)))
	// repair has already turned the input into valid UTF-8, so a declared encoding needs no conversion; without
	// this, a declaration other than UTF-8 would fail the whole document.
	dec.CharsetReader = func(_ string, in io.Reader) (io.Reader, error) { return in, nil }
	var doc xmlLog
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no <nvidia_smi_log> element")
		}
		return nil, err
	}

	snap := &gpu.Snapshot{
		DriverVersion: text(doc.DriverVersion),
		CUDAVersion:   text(doc.CUDAVersion),
	}
	for i, x := range doc.GPUs {
		dev, errs := convertGPU(i, x)
		snap.Errors = append(snap.Errors, errs...)
		if dev != nil {
			snap.Devices = append(snap.Devices, *dev)
		}
	}
	// nvidia-smi leaves out a GPU it cannot open (it says so on stderr) but still counts it in attached_gpus: a
	// missing device must not go unnoticed.
	if n, err := strconv.Atoi(strings.TrimSpace(doc.AttachedGPUs)); err == nil && n > len(doc.GPUs) {
		snap.Errors = append(snap.Errors, gpu.DeviceError{
			Index:     -1,
			Operation: gpu.OpDevice,
			Err:       fmt.Errorf("nvidia-smi reports %d attached GPUs but lists %d", n, len(doc.GPUs)),
		})
	}
	return snap, nil
}

func convertGPU(index int, x xmlGPU) (*gpu.Device, []gpu.DeviceError) {
	uuid := text(x.UUID)
	if uuid == "" {
		// Every series is labelled with the UUID; a device without one cannot be exported.
		return nil, []gpu.DeviceError{{Index: index, Operation: gpu.OpDevice, Err: fmt.Errorf("GPU %s has no UUID (%q)",
			firstNonEmpty(text(x.PCIBusID), text(x.ID), "at position "+strconv.Itoa(index)), strings.TrimSpace(x.UUID))}}
	}
	d := &gpu.Device{
		Index:    index,
		UUID:     uuid,
		Name:     text(x.ProductName),
		PCIBusID: firstNonEmpty(text(x.PCIBusID), text(x.ID)),
		MIGMode:  migMode(x.CurrentMIG),

		MinorNumber: minorNumber(x.MinorNumber),

		MemoryTotalBytes: bytesValue(x.FBMemory.Total),
		MemoryUsedBytes:  bytesValue(x.FBMemory.Used),
		MemoryFreeBytes:  bytesValue(x.FBMemory.Free),

		UtilizationRatio:        utilization(x.Utilization.GPU),
		MemoryUtilizationRatio:  utilization(x.Utilization.Memory),
		EncoderUtilizationRatio: utilization(x.Utilization.Encoder),
		DecoderUtilizationRatio: utilization(x.Utilization.Decoder),

		TemperatureCelsius: quantity(x.GPUTemp, celsius, true),
		PowerUsageWatts: firstValid(
			quantity(x.GPUPowerReadings.AveragePowerDraw, watts, false),
			quantity(x.GPUPowerReadings.InstantPowerDraw, watts, false),
			quantity(x.GPUPowerReadings.PowerDraw, watts, false),
			quantity(x.PowerReadings.AveragePowerDraw, watts, false),
			quantity(x.PowerReadings.InstantPowerDraw, watts, false),
			quantity(x.PowerReadings.PowerDraw, watts, false),
		),
		PowerLimitWatts: firstValid(
			quantity(x.GPUPowerReadings.CurrentPowerLimit, watts, false),
			quantity(x.GPUPowerReadings.EnforcedPowerLimit, watts, false),
			quantity(x.GPUPowerReadings.PowerLimit, watts, false),
			quantity(x.PowerReadings.CurrentPowerLimit, watts, false),
			quantity(x.PowerReadings.EnforcedPowerLimit, watts, false),
			quantity(x.PowerReadings.PowerLimit, watts, false),
		),
		EnergyJoules: firstValid(
			quantity(x.GPUPowerReadings.TotalEnergy, joules, false),
			quantity(x.PowerReadings.TotalEnergy, joules, false),
			quantity(x.TotalEnergy, joules, false),
		),
		FanSpeedRatio:    quantity(x.FanSpeed, percent, false),
		PerformanceState: pstate(x.PerformanceState),
	}

	for _, c := range []struct{ name, v string }{
		{"graphics", x.Clocks.Graphics}, {"sm", x.Clocks.SM}, {"memory", x.Clocks.Memory}, {"video", x.Clocks.Video},
	} {
		if v := quantity(c.v, hertz, false); v.Valid {
			d.Clocks = append(d.Clocks, gpu.Clock{Name: c.name, Hertz: v.V})
		}
	}

	e := x.ECCAggregate
	if v := firstValid(count(e.SingleBitTotal), sum(count(e.SRAMCorrectable), count(e.DRAMCorrectable))); v.Valid {
		d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: "corrected", Count: v.V})
	}
	if v := firstValid(count(e.DoubleBitTotal), sum(count(e.SRAMUncorrectable), count(e.SRAMUncorrectableParity),
		count(e.SRAMUncorrectableSECDED), count(e.DRAMUncorrectable))); v.Valid {
		d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: "uncorrected", Count: v.V})
	}

	var errs []gpu.DeviceError
	for _, m := range x.MIGDevices {
		gi, gok := instanceID(m.GPUInstanceID)
		ci, cok := instanceID(m.ComputeInstanceID)
		if !gok || !cok {
			errs = append(errs, gpu.DeviceError{Index: index, UUID: uuid, Operation: gpu.OpMIG,
				Err: fmt.Errorf("MIG device with unreadable instance ids (gpu_instance_id %q, compute_instance_id %q)",
					strings.TrimSpace(m.GPUInstanceID), strings.TrimSpace(m.ComputeInstanceID))})
			continue
		}
		mem := m.FBMemory
		if mem == (xmlMemory{}) {
			mem = m.SharedFBMemory
		}
		d.MIG = append(d.MIG, gpu.MIGInstance{
			UUID:             text(m.UUID),
			GPUInstance:      gi,
			ComputeInstance:  ci,
			MemoryTotalBytes: bytesValue(mem.Total),
			MemoryUsedBytes:  bytesValue(mem.Used),
		})
	}

	// <processes> present means nvidia-smi could list them, even when the list is empty; absent, or holding only a
	// marker such as N/A, means we do not know.
	if p := x.Processes; p != nil && (len(p.Processes) > 0 || strings.TrimSpace(p.Text) == "" ||
		strings.EqualFold(strings.TrimSpace(p.Text), "None")) {
		d.ProcessesListed = true
		for _, xp := range p.Processes {
			proc, err := convertProcess(xp)
			if err != nil {
				errs = append(errs, gpu.DeviceError{Index: index, UUID: uuid, Operation: gpu.OpProcesses, Err: err})
				continue
			}
			d.Processes = addProcess(d.Processes, proc)
		}
	}
	return d, errs
}

// addProcess adds a process, merging it with an entry for the same PID on the same GPU or MIG instance: nvidia-smi
// lists a process once per kind of context it has (a C and a G entry), as NVML's separate compute and graphics
// lists do. Like the NVML source, the merged entry takes the combined type and the larger memory reading.
func addProcess(procs []gpu.Process, p gpu.Process) []gpu.Process {
	for i := range procs {
		q := &procs[i]
		if q.PID != p.PID || q.MIG != p.MIG || q.GPUInstance != p.GPUInstance || q.ComputeInstance != p.ComputeInstance {
			continue
		}
		q.Type = mergeTypes(q.Type, p.Type)
		if p.UsedMemoryBytes.Valid && (!q.UsedMemoryBytes.Valid || p.UsedMemoryBytes.V > q.UsedMemoryBytes.V) {
			q.UsedMemoryBytes = p.UsedMemoryBytes
		}
		if q.Name == "" {
			q.Name = p.Name
		}
		return procs
	}
	return append(procs, p)
}

func mergeTypes(a, b string) string {
	switch {
	case a == b || b == "":
		return a
	case a == "":
		return b
	case a == gpu.ProcessMPS || b == gpu.ProcessMPS:
		return gpu.ProcessMPS
	}
	return gpu.ProcessComputeAndGraphics
}

func convertProcess(x xmlProcess) (gpu.Process, error) {
	pid, err := strconv.ParseUint(strings.TrimSpace(x.PID), 10, 32)
	if err != nil || pid == 0 {
		return gpu.Process{}, fmt.Errorf("process with unreadable pid %q", strings.TrimSpace(x.PID))
	}
	p := gpu.Process{
		PID:             uint32(pid),
		Name:            strings.TrimSpace(x.Name),
		Type:            processType(x.Type),
		UsedMemoryBytes: bytesValue(x.UsedMemory),
	}
	// Outside MIG both ids are N/A. A process on a MIG device has both; one without the other is not a placement we
	// can name, so it is reported as a whole-GPU process.
	gi, gok := instanceID(x.GPUInstanceID)
	ci, cok := instanceID(x.ComputeInstanceID)
	if gok && cok {
		p.MIG, p.GPUInstance, p.ComputeInstance = true, gi, ci
	}
	return p, nil
}

// processType maps nvidia-smi's process type letters to SPEC's names. nvidia-smi documents C (compute), G
// (graphics), M (MPS compute) and the combinations C+G and M+C.
func processType(s string) string {
	var c, g, m bool
	for _, part := range strings.Split(strings.ToUpper(strings.TrimSpace(s)), "+") {
		switch strings.TrimSpace(part) {
		case "C":
			c = true
		case "G":
			g = true
		case "M":
			m = true
		default:
			return ""
		}
	}
	switch {
	case m:
		return gpu.ProcessMPS
	case c && g:
		return gpu.ProcessComputeAndGraphics
	case c:
		return gpu.ProcessCompute
	case g:
		return gpu.ProcessGraphics
	}
	return ""
}

func migMode(s string) gpu.MIGMode {
	switch m := gpu.MIGMode(strings.ToLower(text(s))); m {
	case gpu.MIGEnabled, gpu.MIGDisabled:
		return m
	}
	return gpu.MIGUnsupported
}

// text returns an element's text, or "" when it is one of nvidia-smi's markers for a missing value.
func text(s string) string {
	s = strings.TrimSpace(s)
	if unavailable(s) {
		return ""
	}
	return s
}

// unavailable reports whether s is how nvidia-smi says that it has no value. Numbers are checked strictly anyway;
// this matters for text fields (UUID, name, driver version) where anything is a valid string.
func unavailable(s string) bool {
	inner := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	switch strings.ToLower(inner) {
	case "", "n/a", "na", "not supported", "not available", "insufficient permissions", "unknown", "unknown error",
		"gpu is lost", "gpu requires reset", "requested functionality has been deprecated", "none":
		return true
	}
	return false
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func firstValid(vs ...gpu.Value) gpu.Value {
	for _, v := range vs {
		if v.Valid {
			return v
		}
	}
	return gpu.Value{}
}

// sum adds the valid parts; it is invalid only when no part is valid (a schema has some of the counters only).
func sum(vs ...gpu.Value) gpu.Value {
	var out gpu.Value
	for _, v := range vs {
		if v.Valid {
			out.V += v.V
			out.Valid = true
		}
	}
	return out
}

// unit converts a unit nvidia-smi prints into the factor to the base unit.
type unit func(string) (float64, bool)

func memoryUnits(u string) (float64, bool) {
	switch u {
	case "B":
		return 1, true
	case "KiB":
		return 1 << 10, true
	case "MiB":
		return mib, true
	case "GiB":
		return 1 << 30, true
	}
	return 0, false
}

func celsius(u string) (float64, bool) { return 1, u == "C" }

func watts(u string) (float64, bool) {
	switch u {
	case "W":
		return 1, true
	case "mW":
		return 1e-3, true
	}
	return 0, false
}

func joules(u string) (float64, bool) {
	switch u {
	case "J":
		return 1, true
	case "mJ":
		return 1e-3, true
	case "kJ":
		return 1e3, true
	}
	return 0, false
}

func hertz(u string) (float64, bool) {
	switch u {
	case "Hz":
		return 1, true
	case "kHz":
		return 1e3, true
	case "MHz":
		return 1e6, true
	case "GHz":
		return 1e9, true
	}
	return 0, false
}

func percent(u string) (float64, bool) { return 0.01, u == "%" }

func bytesValue(s string) gpu.Value { return quantity(s, memoryUnits, false) }

func utilization(s string) gpu.Value {
	v := quantity(s, percent, false)
	if v.Valid && v.V > 1 {
		return gpu.Value{}
	}
	return v
}

// quantity parses "<number> <unit>" with a unit from units. A bare number is refused: nvidia-smi always prints the
// unit, and guessing it would turn MiB into bytes.
func quantity(s string, units unit, allowNegative bool) gpu.Value {
	fields := strings.Fields(s)
	if len(fields) == 1 {
		// "30%" without the space: split the unit off the number.
		f := fields[0]
		i := strings.IndexFunc(f, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.' || r == '-') })
		if i <= 0 {
			return gpu.Value{}
		}
		fields = []string{f[:i], f[i:]}
	}
	if len(fields) != 2 {
		return gpu.Value{}
	}
	factor, ok := units(fields[1])
	if !ok {
		return gpu.Value{}
	}
	v, ok := decimal(fields[0], allowNegative)
	if !ok {
		return gpu.Value{}
	}
	if v *= factor; math.IsInf(v, 0) {
		return gpu.Value{}
	}
	return gpu.Known(v)
}

// count parses a non-negative integer counter without unit.
func count(s string) gpu.Value {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return gpu.Value{}
	}
	return gpu.Known(float64(n))
}

// decimal accepts only plain decimal notation: strconv.ParseFloat would also take "NaN", "Inf", hex floats and
// exponents, none of which nvidia-smi prints.
func decimal(s string, allowNegative bool) (float64, bool) {
	digits, dot := 0, false
	for i, r := range s {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case r == '.' && !dot:
			dot = true
		case r == '-' && i == 0 && allowNegative:
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

func pstate(s string) gpu.Value {
	s = strings.TrimSpace(s)
	if len(s) < 2 || (s[0] != 'P' && s[0] != 'p') {
		return gpu.Value{}
	}
	n, err := strconv.Atoi(s[1:])
	if err != nil || n < 0 || n > 15 || strings.HasPrefix(s[1:], "+") {
		return gpu.Value{}
	}
	return gpu.Known(float64(n))
}

// minorNumber parses <minor_number>, N/A on Windows.
func minorNumber(s string) gpu.Value {
	if n, ok := instanceID(s); ok {
		return gpu.Known(float64(n))
	}
	return gpu.Value{}
}

// instanceID parses a MIG GPU or compute instance id; N/A (not MIG) and anything else yields false.
func instanceID(s string) (int, bool) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 31)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// repair makes nvidia-smi's output well-formed enough for encoding/xml without changing any well-formed part of it.
// nvidia-smi writes process names unescaped and unchecked, so a single odd process on the node would otherwise
// fail every scrape:
//   - bytes that are not valid UTF-8 (seen when nvidia-smi runs concurrently: <process_name>\xff…) and characters
//     that XML forbids become U+FFFD;
//   - a bare '&' that starts no entity encoding/xml knows becomes "&amp;";
//   - a '<' inside <process_name>…</process_name> becomes "&lt;".
func repair(b []byte) []byte {
	out := make([]byte, 0, len(b)+64)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1, !xmlChar(r):
			out = utf8.AppendRune(out, utf8.RuneError)
		case r == '&' && !entityAt(b[i:]):
			out = append(out, "&amp;"...)
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return escapeProcessNames(out)
}

func xmlChar(r rune) bool {
	return r == 0x09 || r == 0x0A || r == 0x0D ||
		r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// entityAt reports whether b starts with an entity or character reference that encoding/xml accepts.
func entityAt(b []byte) bool {
	if len(b) > 12 {
		b = b[:12]
	}
	end := bytes.IndexByte(b, ';')
	if end < 2 {
		return false
	}
	name := string(b[1:end])
	switch name {
	case "amp", "lt", "gt", "quot", "apos":
		return true
	}
	if strings.HasPrefix(name, "#x") {
		_, err := strconv.ParseUint(name[2:], 16, 32)
		return err == nil && len(name) > 2
	}
	if strings.HasPrefix(name, "#") {
		_, err := strconv.ParseUint(name[1:], 10, 32)
		return err == nil && len(name) > 1
	}
	return false
}

// escapeProcessNames escapes '<' in the text of every <process_name> that is closed before the next process
// starts. It runs in linear time: nvidia-smi output is trusted no more than any other input.
func escapeProcessNames(b []byte) []byte {
	open, closing, procEnd := []byte("<process_name>"), []byte("</process_name>"), []byte("</process_info>")
	// next returns the index of the first sep at or after from, len(b) when there is none. *cached remembers the
	// last answer, which stays right while from does not pass it, so that no byte is searched twice.
	next := func(sep []byte, from int, cached *int) int {
		if *cached >= from {
			return *cached
		}
		if i := bytes.Index(b[from:], sep); i >= 0 {
			*cached = from + i
		} else {
			*cached = len(b)
		}
		return *cached
	}
	openAt, closeAt, procEndAt := -1, -1, -1
	var out []byte
	copied, pos := 0, 0 // b[:copied] is in out; b[:pos] has been looked at
	for {
		o := next(open, pos, &openAt)
		if o == len(b) {
			break
		}
		start := o + len(open)
		c := next(closing, start, &closeAt)
		if c == len(b) {
			break
		}
		pos = start
		if next(open, start, &openAt) < c || next(procEnd, start, &procEndAt) < c || bytes.IndexByte(b[start:c], '<') < 0 {
			continue
		}
		out = append(out, b[copied:start]...)
		for _, ch := range b[start:c] {
			if ch == '<' {
				out = append(out, "&lt;"...)
			} else {
				out = append(out, ch)
			}
		}
		copied, pos = c, c
	}
	if copied == 0 {
		return b
	}
	return append(out, b[copied:]...)
}
