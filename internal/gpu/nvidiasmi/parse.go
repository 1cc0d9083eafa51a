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
//   - Power limit is the enforced limit: <current_power_limit> (v12+), else <enforced_power_limit>. The power
//     management limit is the one software set: <requested_power_limit> (v12+), else <power_limit>.
//     <default_power_limit> is neither and is not read.
//   - Process types: C → compute, G → graphics, C+G → compute+graphics, and any type containing M (M, M+C: a
//     process that uses the GPU through an MPS server) → mps. A type we do not know is left empty, not guessed.
//   - Lifetime ECC counts are the <aggregate> counters: single_bit/double_bit totals (v9-v11), or the sum of the
//     SRAM and DRAM counters (v11+, with v13's parity/SEC-DED split of uncorrectable SRAM).
//   - Clock event reasons are <clocks_event_reasons> (535+), else <clocks_throttle_reasons>, each Active or Not
//     Active; a reason printed N/A is one the GPU does not report and is left out, and so are the reasons
//     nvidia-smi does not print (board_limit and reliability, new in NVML 13.4, up to driver 610). Their counters
//     (<clocks_event_reasons_counters>, v13 on 575+) are the violation times: sw_power_cap and sync_boost are NVML's
//     power and sync_boost policies, the thermal and power brake counters keep their reason's name.
//   - PCIe: the current generation is <current_link_gen>, else <device_current_link_gen>; the maximum is
//     <max_link_gen>, the most the GPU and its slot can run (not <max_device_link_gen>, the GPU's own). The replay
//     count is <replay_counter>. <tx_util> and <rx_util> are not read: they are rates over a 20 ms sample, not the
//     byte counters of PCIe.TXBytes/RXBytes, and not the performance monitor's rates of Profiling either.
//   - Remapped rows (Ampere and newer, N/A in MIG mode) and retired pages (before Ampere; pending is
//     <pending_retirement>, else the older <pending_blacklist>) read Yes and No as 1 and 0.
//   - Recovery action (<gpu_recovery_action>, 565+) is NVML's number: None 0, Reset 1, Reboot 2, Drain P2P 3, Drain
//     and Reset 4. Fabric state (<fabric>, 550+) is Not Supported 0, Not Started 1, In Progress 2, Completed 3;
//     the fabric is healthy when registration completed with status Success and bandwidth is not Degraded. The
//     older <gpu_reset_status> (R550) is a different NVML field and is not read as a recovery action.
//   - The vGPU licence follows DCGM: <license_status> Licensed… is 1, Unlicensed… is 0, and a GPU without a vGPU
//     licensed product whose virtualization mode is None or Pass-Through is bare metal: 0.
//   - nvidia-smi -q -x prints no NVLink counters or link states and no performance monitor (GPM) readings: NVLink
//     and Profiling stay empty.
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
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Parse reads the output of `nvidia-smi -q -x`. It fails only when the input is not an nvidia_smi_log document;
// a device without a UUID is reported in Snapshot.Errors and left out, and a value that cannot be read leaves its
// field invalid.
func Parse(r io.Reader) (*gpu.Snapshot, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	return parse(raw)
}

// parse is Parse of the whole output. The snapshot holds no part of raw.
func parse(raw []byte) (*gpu.Snapshot, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty output")
	}
	return decode(skipUnread(repair(raw)))
}

// decode parses a repaired document.
func decode(b []byte) (*gpu.Snapshot, error) {
	dec := xml.NewDecoder(bytes.NewReader(b))
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
