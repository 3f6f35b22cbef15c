"""Measures the FP8 (e4m3) matrix-multiply rate of the local GPU through PyTorch's
_scaled_mm, the limit the sparse MLA benchmark reports against. Prints one number: TFLOP/s
(median of 20 timed 8192^3 products on random data, after warm-up)."""
import torch

n = 8192
a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
one = torch.ones((), device="cuda")
for _ in range(5):
    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
times = []
for _ in range(20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) * 1e-3)
times.sort()
print(f"{2 * n**3 / times[len(times) // 2] / 1e12:.1f}")
