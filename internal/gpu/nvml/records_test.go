//go:build linux && cgo

package nvml

import (
	"encoding/binary"
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// record lays out one process record of size bytes as the driver writes it: pid at 0, usedGpuMemory at 8, and from
// 24 bytes on gpuInstanceId at 16 and computeInstanceId at 20; the 32-byte records of 535.43.02 to 535.86.x end
// with usedGpuCcProtectedMemory at 24. The 4 bytes after pid are padding, which the driver need not clear.
func record(size int, pid uint32, mem uint64, gi, ci uint32, ccMem uint64) []byte {
	r := make([]byte, size)
	binary.NativeEndian.PutUint32(r, pid)
	binary.NativeEndian.PutUint32(r[4:], 0xDEADBEEF)
	binary.NativeEndian.PutUint64(r[8:], mem)
	if size >= recordV2 {
		binary.NativeEndian.PutUint32(r[16:], gi)
		binary.NativeEndian.PutUint32(r[20:], ci)
	}
	if size >= recordLongV3 {
		binary.NativeEndian.PutUint64(r[24:], ccMem)
	}
	return r
}

// Each record layout of NVML's process lists is read at its own size: two records of each, the second on a MIG
// instance where the layout has instance IDs, and NVML's "not available" memory kept as the driver wrote it.
func TestParseRecords(t *testing.T) {
	const notAvailable = 1<<64 - 1
	for _, tc := range []struct {
		name string
		size int
		want []gonvml.ProcessInfo
	}{
		{"nvmlProcessInfo_v1_t, 16 bytes", recordV1, []gonvml.ProcessInfo{
			{Pid: 1001, UsedGpuMemory: 1 << 30, GpuInstanceId: invalidInstanceID, ComputeInstanceId: invalidInstanceID},
			{Pid: 1002, UsedGpuMemory: notAvailable, GpuInstanceId: invalidInstanceID, ComputeInstanceId: invalidInstanceID},
		}},
		{"nvmlProcessInfo_t, 24 bytes", recordV2, []gonvml.ProcessInfo{
			{Pid: 1001, UsedGpuMemory: 1 << 30, GpuInstanceId: invalidInstanceID, ComputeInstanceId: invalidInstanceID},
			{Pid: 1002, UsedGpuMemory: notAvailable, GpuInstanceId: 1, ComputeInstanceId: 0},
		}},
		{"535.43-535.86 _v3, 32 bytes", recordLongV3, []gonvml.ProcessInfo{
			{Pid: 1001, UsedGpuMemory: 1 << 30, GpuInstanceId: invalidInstanceID, ComputeInstanceId: invalidInstanceID},
			{Pid: 1002, UsedGpuMemory: notAvailable, GpuInstanceId: 1, ComputeInstanceId: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := slices.Concat(
				record(tc.size, 1001, 1<<30, invalidInstanceID, invalidInstanceID, 0),
				record(tc.size, 1002, notAvailable, 1, 0, 512<<20),
				record(tc.size, 9999, 0, 0, 0, 0), // room the driver did not fill: past the count
			)
			if got := parseRecords(b, 2, tc.size); !slices.Equal(got, tc.want) {
				t.Errorf("read %+v, want %+v", got, tc.want)
			}
		})
	}
}

// For any bytes a driver writes, parseRecords reads whole records only, never past them; a record's pid and memory
// are its first and second words; a 32-byte record reads as the 24-byte one it begins with, and a 24-byte one as
// the 16-byte one with its instance IDs.
func FuzzParseRecords(f *testing.F) {
	f.Add(record(recordV2, 1001, 1<<30, 1, 0, 0), uint8(1))
	f.Add(slices.Concat(record(recordLongV3, 1, 2, 3, 4, 5), record(recordLongV3, 6, 7, 8, 9, 10)), uint8(2))
	f.Add(record(recordV1, 42, 1<<64-1, 0, 0, 0), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, layout uint8) {
		sizes := [...]int{recordV1, recordV2, recordLongV3}
		size := sizes[int(layout)%len(sizes)]
		n := len(b) / size
		got := parseRecords(b, n, size)
		if len(got) != n {
			t.Fatalf("%d records read from %d of %d bytes, want %d", len(got), len(b), size, n)
		}
		for i, p := range got {
			r := b[i*size:]
			if p.Pid != binary.NativeEndian.Uint32(r) || p.UsedGpuMemory != binary.NativeEndian.Uint64(r[8:]) {
				t.Errorf("record %d read as %+v from % x", i, p, r[:16])
			}
			if size == recordV1 && (p.GpuInstanceId != invalidInstanceID || p.ComputeInstanceId != invalidInstanceID) {
				t.Errorf("16-byte record %d has instance IDs %d/%d", i, p.GpuInstanceId, p.ComputeInstanceId)
			}
			switch size {
			case recordLongV3:
				if short := parseRecords(r, 1, recordV2)[0]; short != p {
					t.Errorf("32-byte record %d read as %+v, as 24 bytes %+v", i, p, short)
				}
			case recordV2:
				short := parseRecords(r, 1, recordV1)[0]
				short.GpuInstanceId, short.ComputeInstanceId = p.GpuInstanceId, p.ComputeInstanceId
				if short != p {
					t.Errorf("24-byte record %d read as %+v, as 16 bytes %+v", i, p, short)
				}
			}
		}
	})
}
