// The cuBLAS and cuRAND entry points candle's CUDA device opens (handles and generators): they
// succeed and do nothing, so that a candle device can be made over the null driver. Tensors
// the benchmarks fill at random hold whatever the allocation held.
#include <stdlib.h>

static void* handle(void) { return malloc(64); }

int cublasCreate_v2(void** h) { *h = handle(); return 0; }
int cublasDestroy_v2(void* h) { free(h); return 0; }
int cublasSetStream_v2(void* h, void* s) { (void)h; (void)s; return 0; }
int curandCreateGenerator(void** g, int kind) { (void)kind; *g = handle(); return 0; }
int curandDestroyGenerator(void* g) { free(g); return 0; }
int curandSetPseudoRandomGeneratorSeed(void* g, unsigned long long seed) { (void)g; (void)seed; return 0; }
int curandSetStream(void* g, void* s) { (void)g; (void)s; return 0; }
int curandGenerateNormal(void* g, float* out, size_t n, float mean, float sd) {
    (void)g; (void)out; (void)n; (void)mean; (void)sd;
    return 0;
}
int curandGenerateNormalDouble(void* g, double* out, size_t n, double mean, double sd) {
    (void)g; (void)out; (void)n; (void)mean; (void)sd;
    return 0;
}
