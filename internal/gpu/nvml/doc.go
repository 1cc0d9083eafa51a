// Package nvml is the GPU source that reads devices, MIG instances, processes and XID errors through NVIDIA's NVML
// library (libnvidia-ml.so.1) with github.com/NVIDIA/go-nvml. docs/validation.md says which driver branches are
// handled and how.
//
// Choices where NVML leaves room:
//   - A value the GPU does not have (NOT_SUPPORTED, NO_DATA, PSTATE_UNKNOWN, NVML_VALUE_NOT_AVAILABLE) is an
//     invalid gpu.Value and not an error. Any other failure of one field is an invalid Value plus a
//     gpu.DeviceError named after the field ("memory", "temperature", "processes", ...).
//   - go-nvml calls functions the driver lacks without a check, and the process dies ("symbol lookup error"), so
//     the functions newer than R418 that this source calls are looked up once after Init (symbols.go) and not
//     called where missing. Field values are asked for only where the driver's branch defines their IDs, and each
//     value's own return code is checked. The process lists are called by the source itself (records.go), not
//     through go-nvml, which retries INSUFFICIENT_SIZE without bound and passes 24-byte records to the _v3 lists
//     that 535.43.02 to 535.86.x fill with 32-byte ones. Where the driver's functions cannot be looked up (go-nvml's
//     mocks), go-nvml's lists are read, except on those drivers, whose GPUs then report a processes error.
//   - Profiling (GPM, Hopper and newer) is computed between a sample taken in each snapshot and one kept from an
//     earlier snapshot (gpm.go): a scrape never waits for an interval.
//   - With a ProcessFallback (nvidia-smi under --gpu.source=auto), a GPU whose processes NVML could not list takes
//     its list from the fallback; that is logged once.
//   - ERROR_GPU_IS_LOST from any call, or a GPU whose handle or UUID cannot be read, drops that GPU from the
//     snapshot with one DeviceError of operation "device"; the other GPUs are still read. A GPU with counted XID
//     errors stays, with only its identity and XID counts, so that XID 79 (fallen off the bus) is exported.
//   - A panic inside go-nvml costs the value or GPU being read, not the exporter.
//   - ECC counts are the aggregate (lifetime) counters, not the volatile ones that reset with the driver, as the
//     nvidia-smi source reads them.
//   - Per-process utilization: NVML returns one sample per process that had non-zero utilization since the
//     last-seen timestamp, and NOT_FOUND when there is none. So a listed process without a sample gets a known 0,
//     and NOT_FOUND is a known 0 for every process; the newest valid sample of a PID wins. Samples of unlisted
//     PIDs, over 100% or out of time are dropped. The values are absent when the call fails or is not supported
//     (always on MIG-enabled GPUs), and for a process whose samples were all dropped. Only the last-seen
//     timestamp per GPU is kept, nothing per PID.
//   - In MIG mode processes are listed per MIG device handle and carry that instance's GPU and compute instance
//     IDs (or, where NVML does not support per-instance lists, from the parent with the IDs in each entry); on
//     GPUs not in MIG mode the instance IDs NVML reports (0xFFFFFFFF) are ignored. MIG memory is the GPU
//     instance's and is set on one MIG device per GPU instance.
//   - After the driver goes away (DRIVER_NOT_LOADED or UNINITIALIZED in a row), NVML is initialized again with a
//     backoff. Close waits for a reading in progress before shutting NVML down.
//   - PIDs are NVML's, which are host PIDs when the exporter runs in the host PID namespace.
//
// go-nvml compiles only with cgo, and NVML exists only on Linux: every file but this one is built for linux with
// cgo, so that the rest of the exporter (the demo, ps and top on a laptop) builds wherever Go does.
package nvml
