// A CUDA driver that does nothing: every call succeeds, device memory is host memory, launches
// and events are no-ops. Loaded in place of libcuda.so.1 (scripts/null-driver/build.sh), it
// lets the library's host path (checks, admissions, parameter blocks, the launch call) run and
// be profiled on a machine without a GPU. Nothing it computes is a kernel's result.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
enum { OK = 0 };

static int context_object;
static __thread void* current;

static void* handle(void) { return malloc(64); }

CUresult cuInit(unsigned f) { (void)f; return OK; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return OK; }
CUresult cuDeviceGet(int* d, int ordinal) { *d = ordinal; return OK; }
CUresult cuDeviceGetName(char* name, int len, int d) {
    (void)d;
    strncpy(name, "null device", (size_t)len);
    return OK;
}
CUresult cuDeviceGetAttribute(int* v, int attribute, int d) {
    (void)d;
    switch (attribute) {
        case 75: *v = 9; break;    // compute capability major
        case 76: *v = 0; break;    // compute capability minor
        case 16: *v = 132; break;  // multiprocessors
        case 115: *v = 1; break;   // memory pools supported
        default: *v = 1; break;
    }
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t* b, int d) { (void)d; *b = (size_t)80 << 30; return OK; }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int d) { (void)d; *ctx = &context_object; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return OK; }
CUresult cuCtxSetCurrent(void* ctx) { current = ctx; return OK; }
CUresult cuCtxGetCurrent(void** ctx) { *ctx = current; return OK; }
CUresult cuCtxGetDevice(int* d) { *d = 0; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuCtxPushCurrent_v2(void* ctx) { current = ctx; return OK; }
CUresult cuCtxPopCurrent_v2(void** ctx) { if (ctx) *ctx = current; return OK; }
CUresult cuStreamCreate(void** s, unsigned f) { (void)f; *s = handle(); return OK; }
CUresult cuStreamCreateWithPriority(void** s, unsigned f, int p) { (void)f; (void)p; *s = handle(); return OK; }
CUresult cuStreamDestroy_v2(void* s) { free(s); return OK; }
CUresult cuStreamSynchronize(void* s) { (void)s; return OK; }
CUresult cuStreamQuery(void* s) { (void)s; return OK; }
CUresult cuStreamWaitEvent(void* s, void* e, unsigned f) { (void)s; (void)e; (void)f; return OK; }
CUresult cuStreamIsCapturing(void* s, int* status) { (void)s; *status = 0; return OK; }
CUresult cuEventCreate(void** e, unsigned f) { (void)f; *e = handle(); return OK; }
CUresult cuEventDestroy_v2(void* e) { free(e); return OK; }
CUresult cuEventRecord(void* e, void* s) { (void)e; (void)s; return OK; }
CUresult cuEventSynchronize(void* e) { (void)e; return OK; }
CUresult cuEventQuery(void* e) { (void)e; return OK; }
CUresult cuEventElapsedTime(float* ms, void* a, void* b) { (void)a; (void)b; *ms = 1.0f; return OK; }
CUresult cuEventElapsedTime_v2(float* ms, void* a, void* b) { (void)a; (void)b; *ms = 1.0f; return OK; }
CUresult cuMemGetInfo_v2(size_t* f, size_t* t) { *f = (size_t)70 << 30; *t = (size_t)80 << 30; return OK; }
static CUresult alloc(CUdeviceptr* p, size_t n) {
    void* m = NULL;
    if (posix_memalign(&m, 256, n ? n : 1)) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return alloc(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, void* s) { (void)s; return alloc(p, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { free((void*)(uintptr_t)p); return OK; }
CUresult cuMemFreeAsync(CUdeviceptr p, void* s) { (void)s; free((void*)(uintptr_t)p); return OK; }
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { memset((void*)(uintptr_t)p, v, n); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void* s) { (void)s; return cuMemsetD8_v2(p, v, n); }
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, void* s) {
    (void)s;
    for (size_t i = 0; i < n; ++i) ((unsigned*)(uintptr_t)p)[i] = v;
    return OK;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) { memcpy((void*)(uintptr_t)d, h, n); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, void* s) { (void)s; return cuMemcpyHtoD_v2(d, h, n); }
CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) { memcpy(h, (void*)(uintptr_t)d, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, void* s) { (void)s; return cuMemcpyDtoH_v2(h, d, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr a, CUdeviceptr b, size_t n) { memmove((void*)(uintptr_t)a, (void*)(uintptr_t)b, n); return OK; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr a, CUdeviceptr b, size_t n, void* s) { (void)s; return cuMemcpyDtoD_v2(a, b, n); }
CUresult cuMemHostAlloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n ? n : 1); return OK; }
CUresult cuMemFreeHost(void* p) { free(p); return OK; }
CUresult cuModuleLoadData(void** m, const void* image) { (void)image; *m = handle(); return OK; }
CUresult cuModuleUnload(void* m) { free(m); return OK; }
CUresult cuModuleGetFunction(void** f, void* m, const char* name) { (void)m; (void)name; *f = handle(); return OK; }
CUresult cuFuncSetAttribute(void* f, int a, int v) { (void)f; (void)a; (void)v; return OK; }
CUresult cuFuncGetAttribute(int* v, int a, void* f) { (void)a; (void)f; *v = 0; return OK; }
// No cluster fits a device that runs nothing: launches that ask take their portable sizes.
CUresult cuOccupancyMaxActiveClusters(int* n, void* f, const void* config) { (void)f; (void)config; *n = 0; return OK; }
// A TMA tensor map: encoded as zeros (no kernel runs to read it).
CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address, const uint64_t* dims,
                                const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                int interleave, int swizzle, int l2, int oob) {
    (void)type; (void)rank; (void)address; (void)dims; (void)strides; (void)box;
    (void)element_strides; (void)interleave; (void)swizzle; (void)l2; (void)oob;
    memset(map, 0, 128);
    return OK;
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void* s, void** params, void** extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s;
    (void)params; (void)extra;
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char** s) { (void)r; *s = "null driver error"; return OK; }
CUresult cuGetErrorName(CUresult r, const char** s) { (void)r; *s = "CUDA_ERROR_NULL_DRIVER"; return OK; }
// NVRTC asks a loaded driver for its private tables: there are none.
CUresult cuGetExportTable(const void** table, const void* id) { (void)id; *table = NULL; return 801; }
// Referenced by candle's CUDA build (linked, not loaded): present so that it loads.
CUresult cuCtxDestroy_v2(void* ctx) { (void)ctx; return OK; }
CUresult cuModuleLoad(void** m, const char* path) { (void)path; *m = handle(); return OK; }
CUresult cuMemcpyPeerAsync(CUdeviceptr d, void* dc, CUdeviceptr s, void* sc, size_t n, void* st) {
    (void)dc; (void)sc; (void)st;
    return cuMemcpyDtoD_v2(d, s, n);
}
int cudaGetDevice(int* d) { *d = 0; return 0; }
int cudaFuncSetAttribute(const void* f, int a, int v) { (void)f; (void)a; (void)v; return 0; }
