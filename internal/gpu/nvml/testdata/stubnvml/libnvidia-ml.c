/*
 * A stub libnvidia-ml.so.1 for the NVML source's tests: two GPUs, built with gcc by stub_test.go and loaded through
 * go-nvml's real dlopen path. It exports exactly the functions of one driver generation, so that what a real
 * driver does and a mock cannot (a missing symbol, a struct written with another layout, go-nvml's own wrappers)
 * happens in CI. Compile-time generation:
 *
 *   STUB_DRIVER_470  R470: no nvmlDeviceGetMemoryInfo_v2, no _v3 process lists, no conf compute, no detail list
 *   STUB_DRIVER_535  R535 before R550: _v3 process lists write 32-byte nvmlProcessDetail_v1_t records where the
 *                    header says nvmlProcessInfo_t (24 bytes), conf compute present, no detail list (go-nvml#75)
 *   (neither)        R550 and later: everything, _v3 lists with the header's 24-byte records, the detail list
 *
 * Run-time behaviour, from the environment:
 *
 *   STUB_NVML_PROCESSES  compute processes on GPU 0 (default 2): PIDs 1001, 1002, ..., using 1, 2, ... GiB
 *   STUB_NVML_XID79      the first event wait after registration reports XID 79 on GPU 1, which is then lost:
 *                        every later call about it answers NVML_ERROR_GPU_IS_LOST
 *   STUB_NVML_UTIL_GROWS nvmlDeviceGetProcessUtilization asks for more room on its second call than on its first,
 *                        as when processes start between go-nvml's two calls (go-nvml#11, #27)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

/* go-nvml's copy of the header, which the bindings were generated from. It wraps each handle in a one-pointer
 * struct (nvmlDevice_t.handle), which has the same ABI as the plain pointer of NVIDIA's header. */
#include "nvml.h"

#define STUB_GPUS 2
#define GIB (1ULL << 30)

struct nvmlDevice_st {
	unsigned int index;
	int lost;
};

struct nvmlEventSet_st {
	int registered;
};

static struct nvmlDevice_st devices[STUB_GPUS] = {{0, 0}, {1, 0}};
static int initialized;
static int xid79_sent;

static int env_int(const char *name, int def) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

static nvmlReturn_t check(nvmlDevice_t d) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (d.handle == NULL || d.handle < devices || d.handle >= devices + STUB_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
	if (d.handle->lost) return NVML_ERROR_GPU_IS_LOST;
	return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length) {
	if (out == NULL || length <= strlen(s)) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(out, s);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { initialized = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	initialized = 0;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
#if defined(STUB_DRIVER_470)
	return copy_string("470.256.02", version, length);
#elif defined(STUB_DRIVER_535)
	return copy_string("535.86.10", version, length);
#else
	return copy_string("550.127.05", version, length);
#endif
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return NVML_SUCCESS; }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
	(void)pid;
	return copy_string("stub-process", name, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	*count = STUB_GPUS;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (index >= STUB_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
	device->handle = &devices[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	snprintf(s, sizeof s, "GPU-stub-%u", d.handle->index);
	return copy_string(s, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
	nvmlReturn_t r = check(d);
	return r != NVML_SUCCESS ? r : copy_string("NVIDIA H200", name, length);
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
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*current = *pending = NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

/* 141 GiB total, 614 MiB reserved, 3 GiB used by processes: used + free + reserved = total in v2; v1's used
 * includes the reservation. */
#define MEM_TOTAL (141 * GIB)
#define MEM_RESERVED (614ULL << 20)
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
	u->gpu = 40;
	u->memory = 20;
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
	*t = 41;
	return NVML_SUCCESS;
}

static nvmlReturn_t uint_value(nvmlDevice_t d, unsigned int *out, unsigned int v) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*out = v;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *p) { return uint_value(d, p, 120000); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *p) { return uint_value(d, p, 700000); }
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
	*e = 5000000;
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

/* The processes of GPU 0: STUB_NVML_PROCESSES of them. */
static unsigned int process_count(nvmlDevice_t d) {
	return d.handle->index == 0 ? (unsigned int)env_int("STUB_NVML_PROCESSES", 2) : 0;
}

/* list fills NVML's process array contract: the count is always returned; records only when they fit. */
#define LIST(record_type, d, count, infos, fill)                                                                      \
	do {                                                                                                               \
		nvmlReturn_t r_ = check(d);                                                                                    \
		if (r_ != NVML_SUCCESS) return r_;                                                                             \
		unsigned int n_ = process_count(d);                                                                            \
		if (*(count) < n_) {                                                                                           \
			*(count) = n_;                                                                                             \
			return NVML_ERROR_INSUFFICIENT_SIZE;                                                                       \
		}                                                                                                              \
		record_type *recs_ = (record_type *)(infos);                                                                   \
		for (unsigned int i = 0; i < n_; i++) {                                                                        \
			memset(&recs_[i], 0, sizeof recs_[i]);                                                                     \
			recs_[i].pid = 1001 + i;                                                                                   \
			recs_[i].usedGpuMemory = (i + 1) * GIB;                                                                    \
			fill;                                                                                                      \
		}                                                                                                              \
		*(count) = n_;                                                                                                 \
		return NVML_SUCCESS;                                                                                           \
	} while (0)

#define NOT_MIG recs_[i].gpuInstanceId = recs_[i].computeInstanceId = 0xFFFFFFFF

static nvmlReturn_t no_processes(nvmlDevice_t d, unsigned int *count) {
	nvmlReturn_t r = check(d);
	if (r != NVML_SUCCESS) return r;
	*count = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	LIST(nvmlProcessInfo_v2_t, d, count, infos, NOT_MIG);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	(void)infos;
	return no_processes(d, count);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
	(void)infos;
	return no_processes(d, count);
}

#if !defined(STUB_DRIVER_470)
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
#if defined(STUB_DRIVER_535)
	/* What 530.x and R535 do: the records are nvmlProcessDetail_v1_t, 8 bytes longer than the header's type. */
	LIST(nvmlProcessDetail_v1_t, d, count, infos, NOT_MIG; recs_[i].usedGpuCcProtectedMemory = 0);
#else
	LIST(nvmlProcessInfo_t, d, count, infos, NOT_MIG);
#endif
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	(void)infos;
	return no_processes(d, count);
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
	LIST(nvmlProcessDetail_v1_t, d, &list->numProcArrayEntries, list->procArray, NOT_MIG);
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
		samples[i].pid = 1001 + i;
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

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (getenv("STUB_NVML_XID79") != NULL && !xid79_sent && (set.handle->registered & 2)) {
		/* GPU 1 falls off the bus: XID 79, and from now on it is lost. */
		xid79_sent = 1;
		devices[1].lost = 1;
		memset(data, 0, sizeof *data);
		data->device.handle = &devices[1];
		data->eventType = nvmlEventTypeXidCriticalError;
		data->eventData = 79;
		data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
		return NVML_SUCCESS;
	}
	struct timespec wait = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000};
	nanosleep(&wait, NULL);
	return NVML_ERROR_TIMEOUT;
}
