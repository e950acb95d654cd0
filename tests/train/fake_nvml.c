/* A fake NVML for the safety monitor's tests (issue 20): the real function names and C signatures
 * of the calls core/nvml.cpp makes, one GPU, readings scripted by the file named in the environment
 * variable BP_FAKE_NVML_SCRIPT (read again at every nvmlInit_v2, so one test process can load it
 * for several runs). The script is whitespace-separated words:
 *
 *   init_fail            nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED (a broken driver)
 *   slowdown 88          the slowdown threshold (else NVML_ERROR_NOT_SUPPORTED)
 *   shutdown 96          the shutdown threshold (else NVML_ERROR_NOT_SUPPORTED)
 *   fail_after 5         nvmlDeviceGetTemperature fails (NVML_ERROR_UNKNOWN) after 5 readings
 *   temps 40 41 92 70    successive nvmlDeviceGetTemperature results; the last one repeats
 *
 * Each nvmlDeviceGetTemperature call takes the next temperature, so the monitor's readings are a
 * script with no clock in it. BP_FAKE_NVML_READS, when set, names a file that receives the number
 * of temperature readings taken so far (tests check how far the script was read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_UNKNOWN = 999 };

struct nvmlDevice_st {
  int index;
};
static struct nvmlDevice_st device0 = {0};

#define MAX_TEMPS 1024
static unsigned temps[MAX_TEMPS];
static int temps_n, reads, init_fail, fail_after, slowdown, shutdown_c;

static void load_script(void) {
  temps_n = reads = init_fail = slowdown = shutdown_c = 0;
  fail_after = -1;
  const char* path = getenv("BP_FAKE_NVML_SCRIPT");
  FILE* f = path ? fopen(path, "r") : NULL;
  if (!f) return;
  char word[64];
  int in_temps = 0;
  while (fscanf(f, "%63s", word) == 1) {
    if (strcmp(word, "init_fail") == 0) {
      init_fail = 1;
      in_temps = 0;
    } else if (strcmp(word, "slowdown") == 0) {
      if (fscanf(f, "%d", &slowdown) != 1) break;
      in_temps = 0;
    } else if (strcmp(word, "shutdown") == 0) {
      if (fscanf(f, "%d", &shutdown_c) != 1) break;
      in_temps = 0;
    } else if (strcmp(word, "fail_after") == 0) {
      if (fscanf(f, "%d", &fail_after) != 1) break;
      in_temps = 0;
    } else if (strcmp(word, "temps") == 0) {
      in_temps = 1;
    } else if (in_temps && temps_n < MAX_TEMPS) {
      temps[temps_n++] = (unsigned)strtoul(word, NULL, 10);
    }
  }
  fclose(f);
}

static void count_read(void) {
  const char* path = getenv("BP_FAKE_NVML_READS");
  FILE* f = path ? fopen(path, "w") : NULL;
  if (!f) return;
  fprintf(f, "%d\n", reads);
  fclose(f);
}

nvmlReturn_t nvmlInit_v2(void) {
  load_script();
  return init_fail ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (index != 0) return NVML_ERROR_NOT_SUPPORTED;
  *device = &device0;
  return NVML_SUCCESS;
}

static unsigned current_temperature(void) {
  if (temps_n == 0) return 40;
  return temps[reads - 1 < temps_n ? reads - 1 : temps_n - 1];
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int* temp) {
  (void)device;
  if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
  if (fail_after >= 0 && reads >= fail_after) return NVML_ERROR_UNKNOWN;
  ++reads;
  count_read();
  *temp = current_temperature();
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int type, unsigned int* temp) {
  (void)device;
  int v = type == 0 ? shutdown_c : type == 1 ? slowdown : 0;
  if (v <= 0) return NVML_ERROR_NOT_SUPPORTED;
  *temp = (unsigned)v;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  (void)device;
  memory->total = 80ull << 30;
  memory->used = 1ull << 30;
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* milliwatts) {
  (void)device;
  *milliwatts = 250000;
  return NVML_SUCCESS;
}

/* HW thermal slowdown (0x40) while the current temperature is at or over the slowdown threshold. */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long* reasons) {
  (void)device;
  *reasons = (slowdown > 0 && reads > 0 && current_temperature() >= (unsigned)slowdown) ? 0x40ull : 0ull;
  return NVML_SUCCESS;
}
