"""`sr.blocks.scaled_mm`'s GEMM and its scaling: the scales applied in PyTorch passes over an
fp32 product, in one epilogue pass, or in the epilogue of a Triton bf16 GEMM (issue 42).

Cases are the three GEMMs of a `QuantizedLinear` step of ``--tokens`` x ``--features`` x
``--out-features`` (per size in ``--sizes``, T x in x out): fprop ``(T, in) x (out, in)^T``
with the bias, dgrad ``(T, out) x (W^T)^T`` with W^T a transposed view (the layer keeps
Q(W) for the backward), wgrad ``(out, T) x (in, T)^T``. Operands are random bf16; the
epilogue (``--epilogue``): "tensor" (two tensor scales, NVFP4's), "rows" (two row scales,
MXFP8's bf16 operands), "all" (row scales, tensor scales, a factor of 4/3). Rows:

- ``cublas_bf16``: ``torch.mm(a, b.T)`` to bf16, no scaling (the reference row);
- ``torch_epilogue``: ``scaled_mm(..., backend="torch")``: cuBLAS to fp32, then the
  PyTorch passes (today's path);
- ``fused_epilogue``: cuBLAS to fp32, then `stochround.kernels.scaled_gemm.fused_epilogue`;
- ``triton_gemm``: `stochround.kernels.scaled_gemm.scaled_gemm` (the scales in the GEMM);
- ``device_alpha``: `stochround.kernels.scaled_gemm.alpha_scaled_gemm` (cuBLASLt's bf16
  GEMM scaled in its own epilogue), where it serves the case: tensor scales alone, so
  dgrad and wgrad under "tensor" (fprop carries a bias);
- ``scaled_mm``: ``scaled_mm(..., backend="auto")`` (what the routing chooses);
- ``triton_<tile>``: the Triton GEMM at each tile of ``--configs`` (to tune
  `stochround.kernels.scaled_gemm.gemm_config`), e.g. ``128x256x64w8s3``: a 128 x 256
  tile, K steps of 64, 8 warps, 3 stages (programs grouped 8 deep).

Checks before timing: the fused epilogue equals the PyTorch passes bit for bit (the same
product); the Triton GEMM and the routed call lie within fp32 accumulation's bound of them
(``K * 2**-24`` of ``|a| |b|^T`` scaled, plus a unit of the bf16 result).

    python benchmarks/bench_gemm.py                                         # GPU
    python benchmarks/bench_gemm.py --configs 128x256x64w8s3,128x256x64w8s4,128x128x64w8s4
    python benchmarks/bench_gemm.py --device cpu --sizes 64x64x64 --epilogue all   # smoke
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

# harness before stochround: without a GPU it selects Triton's interpreter
import harness  # noqa: F401
import torch
from harness import Benchmark, CheckFailed, Run
from torch import Tensor

from stochround.blocks import GemmOperand
from stochround.blocks.gemm import fp32_product, scaled_mm
from stochround.kernels.scaled_gemm import (
    Epilogue,
    GemmConfig,
    alpha_refusal,
    alpha_scaled_gemm,
    fused_epilogue,
    scaled_gemm,
)

EPILOGUES = ("tensor", "rows", "all")
PROVIDERS = ("torch_epilogue", "fused_epilogue", "triton_gemm", "scaled_mm")


class Gemm:
    """One GEMM's operands (seeded) and epilogue: a (M, K), b (N, K) bf16 (b a transposed
    view for dgrad), the scales as ``epilogue`` asks, a bias for fprop."""

    def __init__(
        self, gemm: str, m: int, n: int, k: int, epilogue: str, device: torch.device
    ) -> None:
        generator = torch.Generator(device=device).manual_seed(0)

        def draw(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=generator, device=device)

        self.a = draw(m, k).to(torch.bfloat16)
        self.b = draw(k, n).to(torch.bfloat16).T if gemm == "dgrad" else draw(n, k).bfloat16()
        rows, tensor = epilogue in ("rows", "all"), epilogue in ("tensor", "all")
        self.left = GemmOperand(
            self.a,
            draw(()).abs() if tensor else None,
            draw(m, 1).abs() if rows else None,
            4 / 3 if epilogue == "all" else 1.0,
        )
        self.right = GemmOperand(
            self.b, draw(()).abs() if tensor else None, draw(n, 1).abs() if rows else None, 1.0
        )
        self.bias = draw(n).to(torch.bfloat16) if gemm == "fprop" else None
        self.epilogue = Epilogue(
            self.left.row_scale,
            self.right.row_scale,
            self.left.tensor_scale,
            self.right.tensor_scale,
            self.left.factor,
            self.right.factor,
            self.bias,
            torch.bfloat16,
        )
        self.flops = 2 * m * n * k
        self.outputs = m * n  # the result's elements: a row's size (its shape column)

    def call(self, provider: str) -> Callable[[], Tensor]:
        if provider.startswith("triton_") and provider != "triton_gemm":
            config = parse_config(provider.removeprefix("triton_"))
            return lambda: scaled_gemm(self.a, self.b, self.epilogue, config)
        if provider == "cublas_bf16":
            return lambda: torch.mm(self.a, self.b.T)
        if provider == "fused_epilogue":
            return lambda: fused_epilogue(fp32_product(self.a, self.b), self.epilogue)
        if provider == "triton_gemm":
            return lambda: scaled_gemm(self.a, self.b, self.epilogue)
        if provider == "device_alpha":
            return lambda: alpha_scaled_gemm(self.a, self.b, self.epilogue)
        backend = "torch" if provider == "torch_epilogue" else "auto"
        return partial(
            scaled_mm,
            self.left,
            self.right,
            bias=self.bias,
            out_dtype=torch.bfloat16,
            backend=backend,
        )

    def bound(self) -> Tensor:
        """fp32 accumulation's bound on the scaled result, plus a bf16 unit of it."""
        k = self.a.shape[1]
        magnitude = self.a.float().abs() @ self.b.float().abs().T
        if self.left.row_scale is not None:
            magnitude = magnitude * self.left.row_scale
        if self.right.row_scale is not None:
            magnitude = magnitude * self.right.row_scale.T
        for scale in (self.left.tensor_scale, self.right.tensor_scale):
            magnitude = magnitude if scale is None else magnitude * scale
        return (k + 4) * 2**-24 * magnitude * 4 / 3


def parse_config(text: str) -> GemmConfig:
    """A tile as ``--configs`` writes it: ``<block_m>x<block_n>x<block_k>w<warps>s<stages>``."""
    tile, rest = text.split("w")
    warps, stages = rest.split("s")
    block_m, block_n, block_k = (int(v) for v in tile.split("x"))
    return GemmConfig(block_m, block_n, block_k, 8, int(warps), int(stages))


def row(gemm: Gemm, provider: str, spec: Tensor | None) -> Run:
    """A row: ``provider``'s call, checked against ``spec`` (the PyTorch passes' result)."""
    call = gemm.call(provider)

    def check(output: object) -> str:
        assert isinstance(output, Tensor) and spec is not None
        if provider == "fused_epilogue":
            if not torch.equal(output.view(torch.int16), spec.view(torch.int16)):
                raise CheckFailed("not the PyTorch passes' bits")
            return "bits = torch_epilogue"
        distance = (output.float() - spec.float()).abs()
        allowed = 2 * gemm.bound() + spec.float().abs() * 2**-7
        if not bool((distance <= allowed).all()):
            raise CheckFailed(f"off by up to {float(distance.max()):.3g}")
        return "within fp32 accumulation's bound"

    notes = f"{gemm.flops / 1e12:.3f} TFLOP a call"
    checked = None if spec is None else check
    return Run(call, checked, gemm.outputs, notes=notes, extra={"flops": gemm.flops})


def main() -> int:
    bench = Benchmark("bench_gemm", __doc__)
    add = bench.parser.add_argument
    add("--sizes", default="8192x4096x4096,2048x1024x1024", help="T x in x out, comma-separated")
    add("--epilogue", choices=EPILOGUES, default="tensor", help="the scales applied (tensor)")
    add("--configs", default="", help="Triton GEMM tiles to time, e.g. 128x128x64w8s4 (none)")
    args = bench.parse_args()
    tiles = [f"triton_{c}" for c in args.configs.split(",") if c]
    for tile in tiles:
        parse_config(tile.removeprefix("triton_"))  # a bad one fails before any row runs
    first = True
    for size in args.sizes.split(","):
        tokens, features, out_features = (int(v) for v in size.split("x"))
        shapes = {
            "fprop": (tokens, out_features, features),
            "dgrad": (tokens, features, out_features),
            "wgrad": (out_features, features, tokens),
        }
        for gemm, (m, n, k) in shapes.items():
            case = f"{gemm}_{m}x{n}x{k}_{args.epilogue}"
            operands = Gemm(gemm, m, n, k, args.epilogue, bench.device)
            spec = operands.call("torch_epilogue")()
            if first:
                bench.reference = f"{case}/cublas_bf16"
                first = False
            cublas = partial(row, operands, "cublas_bf16", None)
            bench.add(case, "cublas_bf16", cublas, reference=True)
            alpha = alpha_refusal(operands.a, operands.b, operands.epilogue) is None
            for provider in (*PROVIDERS, *(["device_alpha"] if alpha else []), *tiles):
                checked = None if provider == "torch_epilogue" else spec
                bench.add(case, provider, partial(row, operands, provider, checked), ours=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
