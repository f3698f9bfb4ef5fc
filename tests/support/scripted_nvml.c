/*
 * A scripted NVML: a stand-in for libnvidia-ml.so.1 that makes wandb's own system monitor
 * (wandb-symon in wandb 0.31, wandb-xpu in 0.28 to 0.30) report GPUs that a test describes.
 *
 * The test support (tests/support/nvml.py) builds this file with the system C compiler into
 * a folder of its own, and a node's raylet gets that folder first on LD_LIBRARY_PATH, so
 * every process of that node (the logger actor's wandb-core and its monitor) loads this
 * library where it would load NVIDIA's.
 *
 * Its GPUs come from the file named by SCRIPTED_NVML_GPUS, one GPU a line, fields separated
 * by '|' ('#' starts a comment line):
 *
 *   name|uuid|util %|memory used MiB|memory total MiB|temperature C|power W|power limit W|
 *   SM clock MHz|memory clock MHz|corrected ECC|uncorrected ECC|fan %|state|
 *   aggregate corrected ECC|aggregate uncorrected ECC|uncorrected SRAM ECC
 *
 * The corrected and uncorrected ECC counts are NVML's volatile device-memory (DRAM/HBM) ones;
 * the aggregate (lifetime) ones are never below them; SRAM errors are uncorrected only. So a
 * test can tell which counter a monitor reads (see ecc_count below).
 *
 * state is "ok", "lost" or "mig". A lost GPU fails every call with NVML_ERROR_GPU_IS_LOST, as a
 * GPU that fell off the bus does, its handle lookup by index included (nvidia-smi's "Unable to
 * determine the device handle for GPU ...: GPU is lost"). A "mig" GPU is one in MIG mode: its
 * utilisation call answers NVML_ERROR_NOT_SUPPORTED, as NVML's does for a GPU partitioned into
 * MIG slices, and every other call (memory, temperature, power, clocks, ECC) answers as for an
 * "ok" GPU. The file is read again whenever it changes (its inode, size or
 * modification time), so a test changes a GPU mid-run by replacing the file; write it to a
 * temporary name and rename it over the old one, so no reader sees half a file. The device
 * count is fixed at nvmlInit, as NVML's is: a GPU whose line is gone later counts as lost.
 * Without SCRIPTED_NVML_GPUS (or with a file that cannot be read) nvmlInit fails with
 * NVML_ERROR_DRIVER_NOT_LOADED, as on a machine without NVIDIA's driver.
 *
 * SCRIPTED_NVML_TRACE, when set, names a file to which each function's name is appended the
 * first time a process calls it: how a test learns which functions a monitor asks for.
 *
 * Functions (everything wandb 0.28 to 0.31 calls, and the few Ray's GPU detection calls):
 *   nvmlInit, nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown, nvmlErrorString,
 *   nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion,
 *   nvmlSystemGetCudaDriverVersion_v2, nvmlDeviceGetCount, nvmlDeviceGetCount_v2,
 *   nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByUUID,
 *   nvmlDeviceGetIndex, nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetBrand,
 *   nvmlDeviceGetNumGpuCores, nvmlDeviceGetArchitecture, nvmlDeviceGetPciInfo_v3,
 *   nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
 *   nvmlDeviceGetTemperature, nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit,
 *   nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetClockInfo, nvmlDeviceGetMaxClockInfo,
 *   nvmlDeviceGetMemoryErrorCounter, nvmlDeviceGetTotalEccErrors, nvmlDeviceGetFanSpeed,
 *   nvmlDeviceGetFanSpeed_v2, nvmlDeviceGetNumFans, nvmlDeviceGetTotalEnergyConsumption,
 *   nvmlDeviceGetPcieThroughput, nvmlDeviceGetComputeRunningProcesses(_v2, _v3),
 *   nvmlDeviceGetGraphicsRunningProcesses(_v2, _v3).
 * Any other NVML function is absent: its caller gets "function not found", as from an
 * older driver, and wandb's monitor then stops asking for that metric.
 *
 * This proves the path from NVML through wandb to a run, not what real GPUs report.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_GPU_IS_LOST = 15,
};

#define MAX_GPUS 64
#define NAME_LEN 96

typedef struct {
    char name[NAME_LEN];
    char uuid[NAME_LEN];
    unsigned int util, temp, sm_clock, mem_clock, fan;
    unsigned long long mem_used_mib, mem_total_mib, ecc_corrected, ecc_uncorrected;
    /* aggregate (lifetime) counts, never below the volatile ones; uncorrected volatile SRAM errors */
    unsigned long long ecc_corrected_aggregate, ecc_uncorrected_aggregate, ecc_uncorrected_sram;
    double power_w, limit_w;
    int lost, mig;
} gpu_t;

/* A device handle is a pointer to its slot; the slot's index is what the handle names. */
typedef struct { unsigned int index; } device_t;
typedef device_t *nvmlDevice_t;

typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static gpu_t gpus[MAX_GPUS];
static unsigned int listed;       /* GPUs in the file as last read */
static unsigned int device_count; /* fixed at nvmlInit */
static int initialised;
static device_t devices[MAX_GPUS];
static struct stat seen;          /* the file as last read */
static struct timespec started;

static void trace(const char *fn) {
    /* Each function once a process: a small table of names already written. */
    static const char *written[128];
    static int n;
    const char *path = getenv("SCRIPTED_NVML_TRACE");
    if (!path) return;
    for (int i = 0; i < n; i++)
        if (written[i] == fn) return;
    if (n < 128) written[n++] = fn;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s\n", fn);
    fclose(f);
}
#define TRACE() trace(__func__)

static void copy_field(char *dst, const char *src, size_t cap) {
    while (*src == ' ') src++;
    size_t n = strlen(src);
    while (n && (src[n - 1] == ' ' || src[n - 1] == '\n' || src[n - 1] == '\r')) n--;
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Read the file into gpus[]; -1 when it cannot be read or a line is malformed. */
static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    unsigned int count = 0;
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == 0) continue;
        if (count == MAX_GPUS) break;
        char *fields[17];
        int nf = 0;
        for (char *tok = strtok(p, "|"); tok && nf < 17; tok = strtok(NULL, "|")) fields[nf++] = tok;
        if (nf != 17) {
            fprintf(stderr, "scripted NVML: %s line %d has %d fields, expected 17\n", path, lineno, nf);
            fclose(f);
            return -1;
        }
        gpu_t *g = &gpus[count++];
        copy_field(g->name, fields[0], NAME_LEN);
        copy_field(g->uuid, fields[1], NAME_LEN);
        g->util = (unsigned int)strtoul(fields[2], NULL, 10);
        g->mem_used_mib = strtoull(fields[3], NULL, 10);
        g->mem_total_mib = strtoull(fields[4], NULL, 10);
        g->temp = (unsigned int)strtoul(fields[5], NULL, 10);
        g->power_w = strtod(fields[6], NULL);
        g->limit_w = strtod(fields[7], NULL);
        g->sm_clock = (unsigned int)strtoul(fields[8], NULL, 10);
        g->mem_clock = (unsigned int)strtoul(fields[9], NULL, 10);
        g->ecc_corrected = strtoull(fields[10], NULL, 10);
        g->ecc_uncorrected = strtoull(fields[11], NULL, 10);
        g->fan = (unsigned int)strtoul(fields[12], NULL, 10);
        char state[16];
        copy_field(state, fields[13], sizeof state);
        g->lost = strcmp(state, "lost") == 0;
        g->mig = strcmp(state, "mig") == 0;
        g->ecc_corrected_aggregate = strtoull(fields[14], NULL, 10);
        g->ecc_uncorrected_aggregate = strtoull(fields[15], NULL, 10);
        g->ecc_uncorrected_sram = strtoull(fields[16], NULL, 10);
    }
    fclose(f);
    listed = count;
    return 0;
}

/* Read the file again when it changed since the last read (called under the lock). */
static void refresh(void) {
    const char *path = getenv("SCRIPTED_NVML_GPUS");
    struct stat now;
    if (!path || stat(path, &now) != 0) return;
    if (now.st_ino == seen.st_ino && now.st_size == seen.st_size && now.st_mtim.tv_sec == seen.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == seen.st_mtim.tv_nsec)
        return;
    if (load(path) == 0) seen = now; /* a file caught half-written is read at the next call */
}

/* The GPU a handle names, refreshed, or NULL with the error to return. */
static gpu_t *gpu_of(nvmlDevice_t device, nvmlReturn_t *err) {
    if (!initialised) {
        *err = NVML_ERROR_UNINITIALIZED;
        return NULL;
    }
    if (!device || device < devices || device >= devices + device_count) {
        *err = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    refresh();
    if (device->index >= listed || gpus[device->index].lost) {
        *err = NVML_ERROR_GPU_IS_LOST;
        return NULL;
    }
    return &gpus[device->index];
}

/* The body of a per-device getter: look the GPU up under the lock, or return its error. */
#define WITH_GPU(device, g)              \
    nvmlReturn_t err_ = NVML_SUCCESS;    \
    pthread_mutex_lock(&lock);           \
    gpu_t *g = gpu_of(device, &err_);    \
    if (!g) {                            \
        pthread_mutex_unlock(&lock);     \
        return err_;                     \
    }
#define DONE()                       \
    pthread_mutex_unlock(&lock);     \
    return NVML_SUCCESS

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static nvmlReturn_t init(void) {
    const char *path = getenv("SCRIPTED_NVML_GPUS");
    if (!path) return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!initialised) {
        struct stat now;
        if (stat(path, &now) != 0 || load(path) != 0) {
            ret = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            seen = now;
            device_count = listed;
            for (unsigned int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
            clock_gettime(CLOCK_MONOTONIC, &started);
            initialised = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; TRACE(); return init(); }
nvmlReturn_t nvmlInit_v2(void) { TRACE(); return init(); }
nvmlReturn_t nvmlInit(void) { TRACE(); return init(); }
nvmlReturn_t nvmlShutdown(void) { TRACE(); return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    TRACE();
    return copy_string("550.54.15", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    TRACE();
    return copy_string("12.550.54.15", version, length);
}

static nvmlReturn_t cuda_version(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { TRACE(); return cuda_version(version); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { TRACE(); return cuda_version(version); }

static nvmlReturn_t get_count(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = device_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { TRACE(); return get_count(count); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { TRACE(); return get_count(count); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    /* A GPU off the bus has no handle either: the lookup fails as every call on it does. */
    pthread_mutex_lock(&lock);
    refresh();
    int lost = index >= listed || gpus[index].lost;
    pthread_mutex_unlock(&lock);
    if (lost) return NVML_ERROR_GPU_IS_LOST;
    *device = &devices[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    TRACE();
    return handle_by_index(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    TRACE();
    return handle_by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    TRACE();
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&lock);
    refresh();
    nvmlReturn_t ret = NVML_ERROR_NOT_FOUND;
    for (unsigned int i = 0; i < device_count && i < listed; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &devices[i];
            ret = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    TRACE();
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *index = device->index;
    DONE();
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    TRACE();
    WITH_GPU(device, g);
    nvmlReturn_t ret = copy_string(g->name, name, length);
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    TRACE();
    WITH_GPU(device, g);
    nvmlReturn_t ret = copy_string(g->uuid, uuid, length);
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand) {
    TRACE();
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *brand = 2; /* NVML_BRAND_TESLA */
    DONE();
}

nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *cores) {
    TRACE();
    if (!cores) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *cores = 16896;
    DONE();
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    TRACE();
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *arch = 9; /* NVML_DEVICE_ARCH_HOPPER */
    DONE();
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    TRACE();
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    memset(pci, 0, sizeof *pci);
    pci->bus = 0x10 + device->index;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    DONE();
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    TRACE();
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    if (g->mig) { /* NVML reports no utilisation of a GPU in MIG mode */
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    utilization->gpu = g->util;
    utilization->memory = g->util / 2;
    DONE();
}

static void memory_of(const gpu_t *g, unsigned long long *total, unsigned long long *used, unsigned long long *free_) {
    *total = g->mem_total_mib << 20;
    *used = g->mem_used_mib << 20;
    *free_ = *total > *used ? *total - *used : 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    TRACE();
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    memory_of(g, &memory->total, &memory->used, &memory->free);
    DONE();
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    TRACE();
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    memory_of(g, &memory->total, &memory->used, &memory->free);
    memory->reserved = 0;
    DONE();
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    TRACE();
    if (!temp || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* 0: NVML_TEMPERATURE_GPU */
    WITH_GPU(device, g);
    *temp = g->temp;
    DONE();
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    TRACE();
    if (!milliwatts) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    *milliwatts = (unsigned int)(g->power_w * 1000.0);
    DONE();
}

static nvmlReturn_t power_limit(nvmlDevice_t device, unsigned int *milliwatts) {
    if (!milliwatts) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    *milliwatts = (unsigned int)(g->limit_w * 1000.0);
    DONE();
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    TRACE();
    return power_limit(device, milliwatts);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    TRACE();
    return power_limit(device, milliwatts);
}

/* nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video. Graphics and video follow the SM clock. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    TRACE();
    if (!mhz || type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    *mhz = type == 2 ? g->mem_clock : g->sm_clock;
    DONE();
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    TRACE();
    if (!mhz || type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    *mhz = type == 2 ? g->mem_clock : 1980;
    DONE();
}

/* errorType: 0 corrected, 1 uncorrected; counter and location: the file's counts for each. */
/* NVML's ECC counters: error type 0 corrected, 1 uncorrected; counter type 0 volatile (since the
 * driver loaded or the GPU was reset), 1 aggregate (the GPU's lifetime); location 2 device memory
 * (DRAM/HBM), 7 SRAM, others none here. The file's corrected and uncorrected counts are the
 * volatile device-memory ones; SRAM errors are uncorrected and volatile only (aggregate: the same). */
enum { LOC_DEVICE_MEMORY = 2, LOC_SRAM = 7, LOC_ALL = -1 };
static unsigned long long max_ull(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

static nvmlReturn_t ecc_count(nvmlDevice_t device, int error_type, int counter_type, int location,
                              unsigned long long *count) {
    if (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    unsigned long long dram, sram = error_type == 1 ? g->ecc_uncorrected_sram : 0;
    if (error_type == 0)
        dram = counter_type == 0 ? g->ecc_corrected : max_ull(g->ecc_corrected_aggregate, g->ecc_corrected);
    else
        dram = counter_type == 0 ? g->ecc_uncorrected : max_ull(g->ecc_uncorrected_aggregate, g->ecc_uncorrected);
    *count = location == LOC_DEVICE_MEMORY ? dram : location == LOC_SRAM ? sram : location == LOC_ALL ? dram + sram : 0;
    DONE();
}

nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, int error_type, int counter_type, int location,
                                             unsigned long long *count) {
    TRACE();
    return ecc_count(device, error_type, counter_type, location, count);
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    TRACE();
    return ecc_count(device, error_type, counter_type, LOC_ALL, count);
}

nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *fans) {
    TRACE();
    if (!fans) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *fans = 1;
    DONE();
}

static nvmlReturn_t fan_speed(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    if (!speed || fan != 0) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    *speed = g->fan;
    DONE();
}
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    TRACE();
    return fan_speed(device, fan, speed);
}
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    TRACE();
    return fan_speed(device, 0, speed);
}

/* Energy since nvmlInit at the current power (mJ): a counter that only grows. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *millijoules) {
    TRACE();
    if (!millijoules) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double seconds = (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
    *millijoules = (unsigned long long)(g->power_w * 1000.0 * seconds);
    DONE();
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *kib_per_s) {
    TRACE();
    if (!kib_per_s || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *kib_per_s = 0;
    DONE();
}

/* No process of a test runs on a scripted GPU: every process list is empty. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)infos;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_GPU(device, g);
    (void)g;
    *count = 0;
    DONE();
}
#define NO_PROCESSES(fn)                                                            \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) { \
        TRACE();                                                                     \
        return no_processes(device, count, infos);                                   \
    }
NO_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3)
NO_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2)
NO_PROCESSES(nvmlDeviceGetComputeRunningProcesses)
NO_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3)
NO_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v2)
NO_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses)
