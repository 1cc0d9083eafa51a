/*
 * A stub libnvidia-ml.so.1 for the NVML source's tests: two GPUs, built with gcc by the stubnvml package and loaded
 * through go-nvml's real dlopen path. It exports exactly the functions of one driver generation, and answers as one
 * GPU model, so that what a real driver does and a mock cannot (a missing symbol, a struct written with another
 * layout, go-nvml's own wrappers) happens in CI. Compile-time driver:
 *
 *   STUB_DRIVER_470  470.256.02: no nvmlDeviceGetMemoryInfo_v2, no _v3 process lists, no conf compute, no detail
 *                    list, no GPM, clock throttle reasons only, no versioned fabric info; field IDs up to R470's
 *   STUB_DRIVER_535  535.54.03: _v3 process lists write 32-byte records where the header says nvmlProcessInfo_t
 *                    (24 bytes), conf compute present, no detail list (go-nvml#75); GPM and clock event reasons,
 *                    no versioned fabric info; field IDs up to R535's
 *   (neither)        580.95.05: everything, _v3 lists with the header's 24-byte records, the detail list
 *
 * and GPU model (the same memory for all, so that the memory tests hold for every build):
 *
 *   STUB_GPU_V100    Tesla V100: retired pages, no row remapping, 6 NVLinks
 *   STUB_GPU_A100    A100: row remapping, 12 NVLinks, no GPM (nvmlGpmQueryDeviceSupport says so), no fabric
 *   (neither)        H100: row remapping, 18 NVLinks, GPM, NVSwitch fabric
 *
 * A field ID that the driver generation does not define answers NVML_ERROR_INVALID_ARGUMENT in its own nvmlReturn,
 * so that a test sees a source that asks for it. GPM samples hold counters that advance by one interval per
 * nvmlGpmSampleGet of their entity (GPU or GPU instance), and nvmlGpmMetricsGet computes the metrics from them with
 * unsigned differences, as hardware counters are: samples passed newest first give absurd values.
 *
 * Run-time behaviour, from the environment:
 *
 *   STUB_NVML_PROCESSES  compute processes on GPU 0 (default 2): PIDs 1001, 1002, ..., using 1, 2, ... GiB
 *   STUB_NVML_PROCESSES_FAIL  GPU 0's compute process lists answer NVML_ERROR_UNKNOWN
 *   STUB_NVML_PROCESSES_GROW  GPU 0's process lists answer NVML_ERROR_INSUFFICIENT_SIZE however much room they are
 *                        given, with a count one larger than they were given (up to 4096): go-nvml's lists retry
 *                        that without end
 *   STUB_NVML_XID79      the first event wait after registration reports XID 79 on GPU 1, which is then lost:
 *                        every later call about it answers NVML_ERROR_GPU_IS_LOST
 *   STUB_NVML_XID_STORM  every event wait reports XID 13 on GPU 0 at once, as a driver in an XID storm does
 *   STUB_NVML_SENTINELS  GPU 1 answers NVML_VALUE_NOT_AVAILABLE (-1) for its values, with SUCCESS, as drivers do for
 *                        some GPUs and fields: 0xFFFFFFFF for utilization, temperature, power, PCIe replays and the
 *                        recovery action, 2^64-1 for its energy and NVLink throughput counters
 *   STUB_NVML_UTIL_GROWS nvmlDeviceGetProcessUtilization asks for more room on its second call than on its first,
 *                        as when processes start between go-nvml's two calls (go-nvml#11, #27)
 *   STUB_NVML_MIG        GPU 1 is in MIG mode with GPU instance 1 (one compute instance, 3g.40gb) and GPU
 *                        instance 2 (two compute instances, 1c.3g.40gb each)
 *   STUB_NVML_GPM_BATCH  nvmlGpmMetricsGet called for several metrics at once writes each metric's value into the
 *                        next one's slot, as some drivers give wrong values for batched metrics
 *   STUB_NVML_FABRIC_V2  nvmlDeviceGetGpuFabricInfoV answers version 3 with NVML_ERROR_ARGUMENT_VERSION_MISMATCH, as
 *                        R550 to R575 do
 *   STUB_NVML_REPORT     a file that nvmlShutdown writes "calls=N xids=X samples=M": the NVML calls made, the XID
 *                        events reported, and the GPM samples still allocated
 *   STUB_NVML_GPUS       how many GPUs, 2 (the default) to 8: those from GPU 2 on answer as GPU 0, under their own
 *                        UUID, PCI bus ID and minor number
 *   STUB_NVML_SPREAD     the STUB_NVML_PROCESSES compute processes are dealt round robin over every GPU (PID
 *                        1001 + k on GPU k mod the GPU count), none of them drawing, as on a benchmark's node
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

/* go-nvml's copy of the header, which the bindings were generated from. It wraps each handle in a one-pointer
 * struct (nvmlDevice_t.handle), which has the same ABI as the plain pointer of NVIDIA's header. */
#include "nvml.h"

#if defined(STUB_DRIVER_470)
#define STUB_BRANCH 470
#elif defined(STUB_DRIVER_535)
#define STUB_BRANCH 535
#else
#define STUB_BRANCH 580
#endif

#define STUB_GPUS 2     /* GPUs by default */
#define STUB_MAX_GPUS 8 /* with STUB_NVML_GPUS */
#define STUB_MIGS 3
#define GIB (1ULL << 30)

/* A GPU, or a MIG device (mig_slot >= 0) of GPU 1. */
struct nvmlDevice_st {
	unsigned int index;
	int lost;
	int mig_slot;
	unsigned int gi, ci;
};

struct nvmlGpuInstance_st {
	unsigned int id;
};

struct nvmlEventSet_st {
	int registered;
};

static struct nvmlDevice_st devices[STUB_MAX_GPUS + STUB_MIGS] = {
	{0, 0, -1, 0, 0}, {1, 0, -1, 0, 0}, {2, 0, -1, 0, 0}, {3, 0, -1, 0, 0}, {4, 0, -1, 0, 0}, {5, 0, -1, 0, 0},
	{6, 0, -1, 0, 0}, {7, 0, -1, 0, 0}, {1, 0, 0, 1, 0}, {1, 0, 1, 2, 0}, {1, 0, 2, 2, 1},
};
static unsigned int gpu_count = STUB_GPUS;
static struct nvmlGpuInstance_st gpu_instances[] = {{1}, {2}};
static int initialized;
static int xid79_sent;
static unsigned long long calls, xids_sent;
static long live_samples;

static int env_int(const char *name, int def) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

static int mig_mode(void) { return getenv("STUB_NVML_MIG") != NULL; }

/* sentinel says whether d answers NVML_VALUE_NOT_AVAILABLE for its values (STUB_NVML_SENTINELS, GPU 1). */
static int sentinel(nvmlDevice_t d) { return d.handle->index == 1 && getenv("STUB_NVML_SENTINELS") != NULL; }

static nvmlReturn_t check(nvmlDevice_t d) {
	calls++;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (d.handle == NULL || d.handle < devices || d.handle >= devices + STUB_MAX_GPUS + STUB_MIGS ||
	    d.handle->index >= gpu_count)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d.handle->mig_slot >= 0 && !mig_mode()) return NVML_ERROR_INVALID_ARGUMENT;
	if (devices[d.handle->index].lost) return NVML_ERROR_GPU_IS_LOST;
	return NVML_SUCCESS;
}

static int is_mig(nvmlDevice_t d) { return d.handle->mig_slot >= 0; }

/* check for calls that take a GPU, not a MIG device. */
static nvmlReturn_t check_gpu(nvmlDevice_t d) {
	nvmlReturn_t r = check(d);
	if (r == NVML_SUCCESS && is_mig(d)) return NVML_ERROR_INVALID_ARGUMENT;
	return r;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length) {
	if (out == NULL || length <= strlen(s)) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(out, s);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
	initialized = 1;
	calls = 0;
	int n = env_int("STUB_NVML_GPUS", STUB_GPUS);
	gpu_count = n < STUB_GPUS ? STUB_GPUS : n > STUB_MAX_GPUS ? STUB_MAX_GPUS : (unsigned int)n;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	initialized = 0;
	const char *report = getenv("STUB_NVML_REPORT");
	if (report != NULL) {
		FILE *f = fopen(report, "w");
		if (f != NULL) {
			fprintf(f, "calls=%llu xids=%llu samples=%ld\n", calls, xids_sent, live_samples);
			fclose(f);
		}
	}
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
#if defined(STUB_DRIVER_470)
	return copy_string("470.256.02", version, length);
#elif defined(STUB_DRIVER_535)
	return copy_string("535.54.03", version, length);
#else
	return copy_string("580.95.05", version, length);
#endif
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return NVML_SUCCESS; }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
	(void)pid;
	return copy_string("stub-process", name, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	*count = gpu_count;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
	device->handle = &devices[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	if (is_mig(d)) snprintf(s, sizeof s, "MIG-stub-%u-%d", d.handle->index, d.handle->mig_slot);
	else snprintf(s, sizeof s, "GPU-stub-%u", d.handle->index);
	return copy_string(s, uuid, length);
}

#if defined(STUB_GPU_V100)
#define GPU_NAME "Tesla V100-SXM2-32GB"
#define NVLINKS 6
#elif defined(STUB_GPU_A100)
#define GPU_NAME "NVIDIA A100-SXM4-80GB"
#define NVLINKS 12
#else
#define STUB_GPU_H100 1
#define GPU_NAME "NVIDIA H100 80GB HBM3"
#define NVLINKS 18
#endif

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (!is_mig(d)) return copy_string(GPU_NAME, name, length);
	/* GPU instance 2 is split into two compute instances of one slice each. */
	return copy_string(d.handle->gi == 1 ? GPU_NAME " MIG 3g.40gb" : GPU_NAME " MIG 1c.3g.40gb", name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	memset(pci, 0, sizeof *pci);
	snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", 0x18 + d.handle->index);
	return NVML_SUCCESS;
}

/* The minor number (N of /dev/nvidiaN) differs from the index, as it may on real nodes. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*minor = 2 * d.handle->index + 1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
#if defined(STUB_GPU_V100)
	return NVML_ERROR_NOT_SUPPORTED;
#endif
	*current = *pending = d.handle->index == 1 && mig_mode() ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

static int in_mig_mode(nvmlDevice_t d) { return d.handle->index == 1 && mig_mode(); }

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	*count = in_mig_mode(d) ? 7 : 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (!in_mig_mode(d) || index >= 7) return NVML_ERROR_INVALID_ARGUMENT;
	if (index >= STUB_MIGS) return NVML_ERROR_NOT_FOUND;
	mig->handle = &devices[STUB_MAX_GPUS + index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (!is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
	*id = d.handle->gi;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (!is_mig(d)) return NVML_ERROR_NOT_SUPPORTED;
	*id = d.handle->ci;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (!in_mig_mode(d) || id < 1 || id > 2) return NVML_ERROR_NOT_FOUND;
	gi->handle = &gpu_instances[id - 1];
	return NVML_SUCCESS;
}

/* GPU instance n is the 3g.40gb profile (ID 9) at memory slice 4*(n-1). */
nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
	calls++;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	memset(info, 0, sizeof *info);
	info->device.handle = &devices[1];
	info->id = gi.handle->id;
	info->profileId = 9;
	info->placement.start = 4 * (gi.handle->id - 1);
	info->placement.size = 4;
	return NVML_SUCCESS;
}

/* 80 GiB total, 479 MiB reserved, 3 GiB used by processes: used + free + reserved = total in v2; v1's used
 * includes the reservation. */
#define MEM_TOTAL (80 * GIB)
#define MEM_RESERVED (479ULL << 20)
#define MEM_USED (3 * GIB)

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	m->total = MEM_TOTAL;
	m->used = MEM_USED + MEM_RESERVED;
	m->free = MEM_TOTAL - m->used;
	return NVML_SUCCESS;
}

#if !defined(STUB_DRIVER_470)
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (is_mig(d)) {
		m->total = 40 * GIB;
		m->reserved = 0;
		m->used = GIB;
		m->free = 39 * GIB;
		return NVML_SUCCESS;
	}
	m->total = MEM_TOTAL;
	m->reserved = MEM_RESERVED;
	m->used = MEM_USED;
	m->free = MEM_TOTAL - MEM_RESERVED - MEM_USED;
	return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (in_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
	u->gpu = sentinel(d) ? 0xFFFFFFFF : 40;
	u->memory = sentinel(d) ? 0xFFFFFFFF : 20;
	return NVML_SUCCESS;
}

static nvmlReturn_t video(nvmlDevice_t d, unsigned int *u, unsigned int *period) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*u = 0;
	*period = 167000;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return video(d, u, p); }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return video(d, u, p); }

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (s != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
	*t = sentinel(d) ? 0xFFFFFFFF : 41;
	return NVML_SUCCESS;
}

static nvmlReturn_t uint_value(nvmlDevice_t d, unsigned int *out, unsigned int v) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*out = v;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *p) {
	return uint_value(d, p, sentinel(d) ? 0xFFFFFFFF : 120000);
}
/* The administrator's limit is 700 W; another limit holds the GPU at 650 W. */
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *p) { return uint_value(d, p, 700000); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *p) { return uint_value(d, p, 650000); }
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *s) {
	(void)s;
	nvmlReturn_t r = check(d);
	return r != NVML_SUCCESS ? r : NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *c) {
	(void)t;
	return uint_value(d, c, 1980);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *e) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*e = sentinel(d) ? 0xFFFFFFFFFFFFFFFFULL : 5000000;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, nvmlPstates_t *p) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*p = NVML_PSTATE_0;
	return NVML_SUCCESS;
}

/* Volatile counts reset with the driver; aggregate ones are the GPU's lifetime. Different numbers, so that a test
 * can tell which one was read. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t t, nvmlEccCounterType_t c,
                                         unsigned long long *n) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (c == NVML_VOLATILE_ECC) *n = t == NVML_MEMORY_ERROR_TYPE_CORRECTED ? 1 : 0;
	else if (c == NVML_AGGREGATE_ECC) *n = t == NVML_MEMORY_ERROR_TYPE_CORRECTED ? 7 : 2;
	else return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_SUCCESS;
}

static int spread(void) { return getenv("STUB_NVML_SPREAD") != NULL; }

/* The processes of GPU 0: STUB_NVML_PROCESSES of them; with STUB_NVML_SPREAD, this GPU's share of them. */
static unsigned int process_count(nvmlDevice_t d) {
	unsigned int n = (unsigned int)env_int("STUB_NVML_PROCESSES", 2);
	if (spread()) return is_mig(d) || d.handle->index >= n ? 0 : (n - d.handle->index + gpu_count - 1) / gpu_count;
	return d.handle->index == 0 && !is_mig(d) ? n : 0;
}

/* The PID of a list's i-th process: first + i, or with STUB_NVML_SPREAD the GPU's i-th of the processes dealt. */
static unsigned int pid_at(nvmlDevice_t d, unsigned int first, unsigned int i) {
	return spread() ? 1001 + d.handle->index + i * gpu_count : first + i;
}

/* LIST fills NVML's process array contract for n processes, PIDs first, first+1, ..., using (i+1) GiB each: the
 * count is always returned; records only when they fit. */
#define LIST(record_type, d, count, infos, n, first, fill)                                                            \
	do {                                                                                                               \
		nvmlReturn_t r_ = check(d);                                                                                    \
		if (r_ != NVML_SUCCESS) return r_;                                                                             \
		if ((first) == 1001 && d.handle->index == 0 && getenv("STUB_NVML_PROCESSES_FAIL") != NULL)                     \
			return NVML_ERROR_UNKNOWN;                                                                                 \
		if (d.handle->index == 0 && getenv("STUB_NVML_PROCESSES_GROW") != NULL) {                                      \
			*(count) = *(count) < 4096 ? *(count) + 1 : 4096;                                                          \
			return NVML_ERROR_INSUFFICIENT_SIZE;                                                                       \
		}                                                                                                              \
		unsigned int n_ = (n);                                                                                         \
		if (*(count) < n_) {                                                                                           \
			*(count) = n_;                                                                                             \
			return NVML_ERROR_INSUFFICIENT_SIZE;                                                                       \
		}                                                                                                              \
		record_type *recs_ = (record_type *)(infos);                                                                   \
		for (unsigned int i = 0; i < n_; i++) {                                                                        \
			memset(&recs_[i], 0, sizeof recs_[i]);                                                                     \
			recs_[i].pid = pid_at(d, (first), i);                                                                      \
			recs_[i].usedGpuMemory = ((first) - 1000 + i) * GIB;                                                       \
			fill;                                                                                                      \
		}                                                                                                              \
		*(count) = n_;                                                                                                 \
		return NVML_SUCCESS;                                                                                           \
	} while (0)

/* GPU 0's compute processes, and PID 1002 also drawing, when there are two or more. */
static unsigned int graphics_count(nvmlDevice_t d) { return !spread() && process_count(d) >= 2 ? 1 : 0; }

#define NOT_MIG recs_[i].gpuInstanceId = recs_[i].computeInstanceId = 0xFFFFFFFF

static nvmlReturn_t no_processes(nvmlDevice_t d, unsigned int *count) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*count = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	LIST(nvmlProcessInfo_v2_t, d, count, infos, process_count(d), 1001, NOT_MIG);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	LIST(nvmlProcessInfo_v2_t, d, count, infos, graphics_count(d), 1002, NOT_MIG);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	(void)infos;
	return no_processes(d, count);
}

#if !defined(STUB_DRIVER_470)
/* What 535.43.02-535.86.x do: the records of every _v3 list are nvmlProcessDetail_v1_t, 8 bytes longer than the
 * header's type. */
#if defined(STUB_DRIVER_535)
#define V3_RECORD nvmlProcessDetail_v1_t
#define V3_FILL NOT_MIG; recs_[i].usedGpuCcProtectedMemory = 0
#else
#define V3_RECORD nvmlProcessInfo_t
#define V3_FILL NOT_MIG
#endif
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	LIST(V3_RECORD, d, count, infos, process_count(d), 1001, V3_FILL);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	LIST(V3_RECORD, d, count, infos, graphics_count(d), 1002, V3_FILL);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	(void)infos;
	return no_processes(d, count);
}

nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t d, nvmlConfComputeMemSizeInfo_t *info) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	memset(info, 0, sizeof *info);
	return NVML_SUCCESS;
}
#endif

#if !defined(STUB_DRIVER_470) && !defined(STUB_DRIVER_535)
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *list) {
	if (list->version != nvmlProcessDetailList_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (list->mode != NVML_PROCESS_MODE_COMPUTE) return no_processes(d, &list->numProcArrayEntries);
	LIST(nvmlProcessDetail_v1_t, d, &list->numProcArrayEntries, list->procArray, process_count(d), 1001, NOT_MIG);
}
#endif

/* Per-process utilization: one sample per process, 50% SM, taken just now. With STUB_NVML_UTIL_GROWS the second
 * call finds more samples than the first announced. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long lastSeen) {
	(void)lastSeen;
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	unsigned int n = process_count(d);
	if (n == 0) return NVML_ERROR_NOT_FOUND;
	if (samples != NULL && getenv("STUB_NVML_UTIL_GROWS") != NULL) n += 2;
	if (samples == NULL || *count < n) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	/* NVML's timestamps are CPU time in microseconds. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	for (unsigned int i = 0; i < n; i++) {
		memset(&samples[i], 0, sizeof samples[i]);
		samples[i].pid = pid_at(d, 1001, i);
		samples[i].timeStamp = (unsigned long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
		samples[i].smUtil = 50;
		samples[i].memUtil = 10;
	}
	*count = n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	set->handle = calloc(1, sizeof *set->handle);
	return set->handle ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
	free(set.handle);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*types = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (types & ~(nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError))
		return NVML_ERROR_NOT_SUPPORTED;
	set.handle->registered |= 1 << d.handle->index;
	return NVML_SUCCESS;
}

/* xid reports XID code on GPU index, not on a MIG instance. */
static nvmlReturn_t xid(nvmlEventData_t *data, unsigned int index, unsigned long long code) {
	memset(data, 0, sizeof *data);
	data->device.handle = &devices[index];
	data->eventType = nvmlEventTypeXidCriticalError;
	data->eventData = code;
	data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
	xids_sent++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (getenv("STUB_NVML_XID79") != NULL && !xid79_sent && (set.handle->registered & 2)) {
		/* GPU 1 falls off the bus: XID 79, and from now on it is lost. */
		xid79_sent = 1;
		devices[1].lost = 1;
		return xid(data, 1, 79);
	}
	if (getenv("STUB_NVML_XID_STORM") != NULL && (set.handle->registered & 1)) return xid(data, 0, 13);
	struct timespec wait = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000};
	nanosleep(&wait, NULL);
	return NVML_ERROR_TIMEOUT;
}

/* ---- Health: field values, PCIe, NVLink, clock events, power limits, vGPU licence, fabric ---- */

/* branch_defines says whether this driver generation's header defines a field ID. */
static int branch_defines(unsigned int id) {
	switch (id) {
	case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
	case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
		return STUB_BRANCH >= 555;
	case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
		return STUB_BRANCH >= 565;
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN:
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN:
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN:
		return STUB_BRANCH >= 575;
	default:
		return 1;
	}
}

static void set_uint(nvmlFieldValue_t *v, unsigned int x) {
	v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
	v->value.uiVal = x;
}

static void set_ull(nvmlFieldValue_t *v, unsigned long long x) {
	v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
	v->value.ullVal = x;
}

#if defined(STUB_GPU_V100)
#define ROW_REMAPPING 0
#else
#define ROW_REMAPPING 1
#endif

/* The values of GPU 0; GPU 1 differs where a test needs a second case: no memory temperature (as GPUs without HBM),
 * a pending and a failed row remap, a GPU reset needed. */
static nvmlReturn_t field_value(nvmlDevice_t d, nvmlFieldValue_t *v) {
	int gpu1 = d.handle->index == 1;
	switch (v->fieldId) {
	case NVML_FI_DEV_MEMORY_TEMP:
		if (gpu1) return NVML_ERROR_NOT_SUPPORTED;
		set_uint(v, 38);
		return NVML_SUCCESS;
	case NVML_FI_DEV_RETIRED_SBE:
	case NVML_FI_DEV_RETIRED_DBE:
	case NVML_FI_DEV_RETIRED_PENDING:
		if (ROW_REMAPPING) return NVML_ERROR_NOT_SUPPORTED; /* Ampere and newer remap rows instead */
		set_ull(v, v->fieldId == NVML_FI_DEV_RETIRED_SBE ? 5 : v->fieldId == NVML_FI_DEV_RETIRED_DBE ? 1 : 0);
		return NVML_SUCCESS;
	case NVML_FI_DEV_REMAPPED_COR:
	case NVML_FI_DEV_REMAPPED_UNC:
	case NVML_FI_DEV_REMAPPED_PENDING:
	case NVML_FI_DEV_REMAPPED_FAILURE:
		if (!ROW_REMAPPING || in_mig_mode(d)) return NVML_ERROR_NOT_SUPPORTED;
		switch (v->fieldId) {
		case NVML_FI_DEV_REMAPPED_COR: set_uint(v, gpu1 ? 0 : 2); break;
		case NVML_FI_DEV_REMAPPED_UNC: set_uint(v, gpu1 ? 3 : 1); break;
		default: set_uint(v, gpu1 ? 1 : 0);
		}
		return NVML_SUCCESS;
	case NVML_FI_DEV_NVLINK_LINK_COUNT:
		set_uint(v, NVLINKS);
		return NVML_SUCCESS;
	case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
	case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
		if (v->scopeId != 0xFFFFFFFF) return NVML_ERROR_INVALID_ARGUMENT; /* only the sum is modelled */
		set_ull(v, sentinel(d) ? 0xFFFFFFFFFFFFFFFFULL : v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? 123456 : 654321); /* KiB */
		return NVML_SUCCESS;
	case NVML_FI_DEV_PERF_POLICY_POWER: set_ull(v, 1500000000ULL); return NVML_SUCCESS; /* ns */
	case NVML_FI_DEV_PERF_POLICY_THERMAL: set_ull(v, 250000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: set_ull(v, 0); return NVML_SUCCESS;
	case NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: set_ull(v, 3000000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: set_ull(v, 72500000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_PERF_POLICY_RELIABILITY: return NVML_ERROR_NOT_SUPPORTED;
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: set_ull(v, 400000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: set_ull(v, 0); return NVML_SUCCESS;
	case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: set_ull(v, 2000000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_PCIE_COUNT_TX_BYTES: set_ull(v, 5000000000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: set_ull(v, 7000000000000ULL); return NVML_SUCCESS;
	case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
		set_uint(v, sentinel(d) ? 0xFFFFFFFF : gpu1 ? NVML_GPU_RECOVERY_ACTION_GPU_RESET : NVML_GPU_RECOVERY_ACTION_NONE);
		return NVML_SUCCESS;
	default:
		return NVML_ERROR_NOT_SUPPORTED;
	}
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (count <= 0 || values == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	for (int i = 0; i < count; i++) {
		nvmlFieldValue_t *v = &values[i];
		memset(&v->value, 0, sizeof v->value);
		v->timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
		v->latencyUsec = 0;
		v->nvmlReturn = branch_defines(v->fieldId) ? field_value(d, v) : NVML_ERROR_INVALID_ARGUMENT;
	}
	return NVML_SUCCESS;
}

/* GPU 0's link runs at full width; GPU 1's at half (x8 of x16), a degraded link. */
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *n) {
	return uint_value(d, n, sentinel(d) ? 0xFFFFFFFF : 12);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return uint_value(d, g, 5); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return uint_value(d, g, 5); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { return uint_value(d, w, 16); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *w) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*w = d.handle->index == 1 ? 8 : 16;
	return NVML_SUCCESS;
}

/* Link 3 of every GPU is down. Link l counts 10+l CRC flit errors, l CRC data errors, 2l replays, l%2 recoveries. */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (link >= NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
	*active = link == 3 ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *value) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (link >= NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
	switch (counter) {
	case NVML_NVLINK_ERROR_DL_CRC_FLIT: *value = 10 + link; break;
	case NVML_NVLINK_ERROR_DL_CRC_DATA: *value = link; break;
	case NVML_NVLINK_ERROR_DL_REPLAY: *value = 2 * link; break;
	case NVML_NVLINK_ERROR_DL_RECOVERY: *value = link % 2; break;
	default: return NVML_ERROR_NOT_SUPPORTED;
	}
	return NVML_SUCCESS;
}

/* Every reason but the display clock is supported; the GPU is held at its power cap. The two calls answer alike:
 * R535 renamed "throttle" to "event" and kept the old name. */
static nvmlReturn_t clock_reasons(nvmlDevice_t d, unsigned long long *reasons, int supported) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*reasons = supported ? 0xFFULL : 0x4ULL;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
	return clock_reasons(d, reasons, 0);
}
nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
	return clock_reasons(d, reasons, 1);
}
#if STUB_BRANCH >= 535
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
	return clock_reasons(d, reasons, 0);
}
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
	return clock_reasons(d, reasons, 1);
}
#endif

/* Bare metal: vGPU licensing is not supported, which DCGM reports as 0. */
nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(nvmlDevice_t d, nvmlGridLicensableFeatures_t *f) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	memset(f, 0, sizeof *f);
	f->isGridLicenseSupported = 0;
	return NVML_SUCCESS;
}

#if STUB_BRANCH >= 550
/* H100s on an NVSwitch fabric: GPU 0 registered and healthy, GPU 1 registered with limited capacity (its
 * bandwidth degraded). R580 answers version 3; version 2 has no summary. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfoV_t *info) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (info->version != nvmlGpuFabricInfo_v3 && info->version != nvmlGpuFabricInfo_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (info->version == nvmlGpuFabricInfo_v3 && getenv("STUB_NVML_FABRIC_V2") != NULL)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	unsigned int version = info->version;
	memset(info, 0, version == nvmlGpuFabricInfo_v3 ? sizeof(nvmlGpuFabricInfo_v3_t) : sizeof(nvmlGpuFabricInfo_v2_t));
	info->version = version;
#if defined(STUB_GPU_H100)
	int gpu1 = d.handle->index == 1;
	info->state = NVML_GPU_FABRIC_STATE_COMPLETED;
	info->status = NVML_SUCCESS;
	info->healthMask = (gpu1 ? NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE : NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)
	                   << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW;
	if (version == nvmlGpuFabricInfo_v3)
		info->healthSummary = gpu1 ? NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY : NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
#else
	info->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
#endif
	return NVML_SUCCESS;
}
#endif

/* ---- GPM (R520 and later) ---- */
#if STUB_BRANCH >= 520

/* Metric values of GPU 0 over any interval (percent, or MiB/s). GPU instance g has them divided by 2^g, and no
 * NVLink metrics. */
static double gpm_value(unsigned int id) {
	switch (id) {
	case NVML_GPM_METRIC_GRAPHICS_UTIL: return 85.0;
	case NVML_GPM_METRIC_SM_UTIL: return 72.5;
	case NVML_GPM_METRIC_SM_OCCUPANCY: return 40.0;
	case NVML_GPM_METRIC_ANY_TENSOR_UTIL: return 55.0;
	case NVML_GPM_METRIC_DRAM_BW_UTIL: return 30.0;
	case NVML_GPM_METRIC_FP64_UTIL: return 2.5;
	case NVML_GPM_METRIC_FP32_UTIL: return 20.0;
	case NVML_GPM_METRIC_FP16_UTIL: return 12.5;
	case NVML_GPM_METRIC_PCIE_TX_PER_SEC: return 1024.0;
	case NVML_GPM_METRIC_PCIE_RX_PER_SEC: return 2048.0;
	case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: return 4096.0;
	case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: return 8192.0;
	default: return -1;
	}
}

static int gpm_is_rate(unsigned int id) { return id == 20 || id == 21 || id == 60 || id == 61; }

#define GPM_TICKS 100000000ULL /* counter ticks per interval */
#define GPM_ENTITIES (STUB_MAX_GPUS * 3)

/* A sample: its entity (GPU index * 3 + GPU instance, 0 for the whole GPU) and the entity's counters then. */
struct nvmlGpmSample_st {
	int entity;
	unsigned long long elapsed;
	unsigned long long counter[NVML_GPM_METRIC_MAX];
};

static unsigned long long gpm_reads[GPM_ENTITIES];

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
	calls++;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (s == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	s->handle = calloc(1, sizeof *s->handle);
	if (s->handle == NULL) return NVML_ERROR_MEMORY;
	s->handle->entity = -1;
	live_samples++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
	calls++;
	if (s.handle == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	free(s.handle);
	live_samples--;
	return NVML_SUCCESS;
}

static int gpm_supported(void) {
#if defined(STUB_GPU_H100)
	return 1;
#else
	return 0;
#endif
}

/* gpm_fill advances the entity's counters by one interval and copies them into the sample. */
static void gpm_fill(int entity, struct nvmlGpmSample_st *s) {
	unsigned long long k = ++gpm_reads[entity];
	int gi = entity % 3;
	s->entity = entity;
	s->elapsed = k * GPM_TICKS;
	for (unsigned int id = 0; id < NVML_GPM_METRIC_MAX; id++) {
		double v = gpm_value(id);
		if (v < 0 || (gi > 0 && (id == 60 || id == 61))) continue;
		/* per interval: percent of GPM_TICKS/100 ticks, or MiB (an interval is one second) */
		double per = gpm_is_rate(id) ? v : v * (GPM_TICKS / 100) / (1 << gi);
		if (gpm_is_rate(id)) per /= (1 << gi);
		s->counter[id] = k * (unsigned long long)per;
	}
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (!gpm_supported()) return NVML_ERROR_NOT_SUPPORTED;
	if (s.handle == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	/* A MIG device handle samples its GPU instance, as nvmlGpmMigSampleGet does. */
	gpm_fill((int)d.handle->index * 3 + (is_mig(d) ? (int)d.handle->gi : 0), s.handle);
	return NVML_SUCCESS;
}

#if STUB_BRANCH >= 525
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gpuInstanceId, nvmlGpmSample_t s) {
	nvmlReturn_t r = check_gpu(d);
	if (r != NVML_SUCCESS) return r;
	if (!gpm_supported()) return NVML_ERROR_NOT_SUPPORTED;
	if (!in_mig_mode(d) || gpuInstanceId < 1 || gpuInstanceId > 2) return NVML_ERROR_NOT_FOUND;
	if (s.handle == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	gpm_fill((int)d.handle->index * 3 + (int)gpuInstanceId, s.handle);
	return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	if (support == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	support->isSupportedDevice = (unsigned int)gpm_supported();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
	calls++;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (m == NULL || m->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	struct nvmlGpmSample_st *a = m->sample1.handle, *b = m->sample2.handle;
	if (a == NULL || b == NULL || a->entity < 0 || a->entity != b->entity || m->numMetrics > NVML_GPM_METRIC_MAX)
		return NVML_ERROR_INVALID_ARGUMENT;
	/* Unsigned differences, as of hardware counters: sample1 must be the older one. */
	unsigned long long ticks = b->elapsed - a->elapsed;
	for (unsigned int i = 0; i < m->numMetrics; i++) {
		nvmlGpmMetric_t *metric = &m->metrics[i];
		unsigned int id = metric->metricId;
		metric->value = 0;
		if (id >= NVML_GPM_METRIC_MAX || gpm_value(id) < 0 || (a->entity % 3 > 0 && (id == 60 || id == 61))) {
			metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
			continue;
		}
		double delta = (double)(b->counter[id] - a->counter[id]);
		metric->value = gpm_is_rate(id) ? delta / ((double)ticks / GPM_TICKS) : delta * 100.0 / (double)ticks;
		metric->nvmlReturn = NVML_SUCCESS;
	}
	if (getenv("STUB_NVML_GPM_BATCH") != NULL && m->numMetrics > 1) {
		double first = m->metrics[0].value;
		for (unsigned int i = 0; i + 1 < m->numMetrics; i++) m->metrics[i].value = m->metrics[i + 1].value;
		m->metrics[m->numMetrics - 1].value = first;
	}
	return NVML_SUCCESS;
}
#endif
