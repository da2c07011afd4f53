#!/usr/bin/env python3
"""Distill CUTLASS's own kernel generator into a compact GEMM knowledge base.

Runs the generator functions of the installed `nvidia-cutlass` wheel
(cutlass_library.generator: GenerateSM90_* and GenerateSM80_*) into
cutlass_library.manifest.Manifest objects, exactly as CUTLASS's CMake build
would with CUTLASS_LIBRARY_KERNELS=all, keeps the dense f32/tf32/bf16/f16 GEMMs
and writes a deterministic JSON file (format 1) listing the instantiations
CUTLASS declares valid: tiles, clusters, schedules, stages, layouts, alignments.

Offline, no GPU, no CUDA toolkit needed (the generator is pure Python).

    .venv/bin/python tools/distill_cutlass.py [--out knowledge/cutlass-<version>.json]

fact reads the output at run time to derive its candidate space; a future
`fact knowledge refresh` command calls this script.
"""

import argparse
import collections
import importlib.metadata
import json
import logging
import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    from cutlass_library import generator as gen
    from cutlass_library import sm90_utils
    from cutlass_library.manifest import Manifest
    from cutlass_library.library import (
        DataType,
        DataTypeNames,
        DataTypeSize,
        EpilogueScheduleSuffixes,
        EpilogueScheduleType,
        GemmKind,
        KernelScheduleSuffixes,
        KernelScheduleType,
        LayoutType,
        MathOperation,
        OperationKind,
        ShortLayoutTypeNames,
        TileSchedulerType,
        ComplexTransform,
        get_tma_alignment,
        is_tma_epilogue,
    )
except ImportError as e:  # pragma: no cover
    sys.exit(f"distill_cutlass: cannot import cutlass_library ({e}); run with .venv/bin/python "
             "after ./setup (it installs nvidia-cutlass)")

# --------------------------------------------------------------------------------------------
# Which generator functions run, per arch.  Each is called as fn(manifest, cuda_version).

SM90_GENERATORS = [
    "GenerateSM90_TensorOp_tf32_WGMMA_gemm",
    "GenerateSM90_TensorOp_tf32_WGMMA_alignx_gemm",
    "GenerateSM90_TensorOp_16b_WGMMA_gemm",
    "GenerateSM90_TensorOp_16b_WGMMA_alignx_gemm",
]
SM80_GENERATORS = [
    "GenerateSM80_TensorOp_1688",               # tf32 math; A/B stored as tfloat32_t (dropped below)
    "GenerateSM80_TensorOp_1688_fast_math",     # f32 in/out, tf32 math (kept as math "tf32")
    "GenerateSM80_TensorOp_1688_fast_fp32_math",  # f32 in/out, 3xTF32 (math "tf32x3")
    "GenerateSM80_TensorOp_16816",              # f16 / bf16
]

CUDA_VERSION = "13.0"

# --------------------------------------------------------------------------------------------
# Explicit name tables.  Anything not listed falls back to the library's own short name.

DATA_TYPE = {
    DataType.f32: "f32",
    DataType.tf32: "tf32",
    DataType.bf16: "bf16",
    DataType.f16: "f16",
    DataType.void: "void",
}

KERNEL_SCHEDULE = {
    KernelScheduleType.ScheduleAuto: "auto",
    KernelScheduleType.TmaWarpSpecialized: "ws",
    KernelScheduleType.TmaWarpSpecializedCooperative: "ws_cooperative",
    KernelScheduleType.TmaWarpSpecializedPingpong: "ws_pingpong",
    KernelScheduleType.CpAsyncWarpSpecialized: "cpasync_ws",
    KernelScheduleType.CpAsyncWarpSpecializedCooperative: "cpasync_ws_cooperative",
    KernelScheduleType.CpAsyncWarpSpecializedPingpong: "cpasync_ws_pingpong",
    KernelScheduleType.Tma: "tma",
    KernelScheduleType.Multistage: "multistage",
}

EPILOGUE_SCHEDULE = {
    EpilogueScheduleType.ScheduleAuto: "auto",
    EpilogueScheduleType.TmaWarpSpecialized: "tma_ws",
    EpilogueScheduleType.TmaWarpSpecializedCooperative: "tma_ws_cooperative",
    EpilogueScheduleType.NoSmemWarpSpecialized: "no_smem",
    EpilogueScheduleType.EpilogueTransposed: "transposed",
}

# TileSchedulerType.Default is emitted as `void`, which every sm90 kernel resolves through
# TileSchedulerSelector<void, ...> to the same scheduler as PersistentScheduler.
TILE_SCHEDULER = {
    TileSchedulerType.Default: "persistent",
    TileSchedulerType.Persistent: "persistent",
    TileSchedulerType.StreamK: "stream_k",
}

LAYOUT = {
    LayoutType.ColumnMajor: "n",
    LayoutType.RowMajor: "t",
}

# Schedules outside the dense, single-GEMM scope (name fragments of the enum members).
SKIP_SCHEDULE_FRAGMENTS = ("FP8", "Blockwise", "PtrArray", "Grouped", "BlockScaled", "Sparse",
                           "Mixed", "Sm100", "Sm103", "Sm120", "Nvf4", "Mxf", "Implicit")


def dtype_name(dt):
    return DATA_TYPE.get(dt) or DataTypeNames.get(dt) or dt.name


def layout_name(lt):
    return LAYOUT.get(lt) or ShortLayoutTypeNames.get(lt) or lt.name


def kernel_schedule_name(ks):
    if ks in KERNEL_SCHEDULE:
        return KERNEL_SCHEDULE[ks]
    return KernelScheduleSuffixes.get(ks, "").lstrip("_") or ks.name


def epilogue_schedule_name(es):
    if es in EPILOGUE_SCHEDULE:
        return EPILOGUE_SCHEDULE[es]
    return EpilogueScheduleSuffixes.get(es, "").lstrip("_") or es.name


def tile_scheduler_name(ts):
    return TILE_SCHEDULER.get(ts) or ts.name.lower()


def skipped_schedule(op):
    names = (op.kernel_schedule.name, op.epilogue_schedule.name)
    return any(f in n for n in names for f in SKIP_SCHEDULE_FRAGMENTS)


# --------------------------------------------------------------------------------------------
# SM90 tile descriptions carry a stub instruction shape [0,0,0] and come back as a set (iteration
# order depends on object ids). Wrap the helper so each tile remembers the WGMMA shape it was
# built from, and so the order is deterministic: for the same CTA tile, the larger WGMMA N comes
# first, which is the shape cute::GMMA::ss_op_selector picks and what the manifest then keeps
# (it dedupes by kernel name, first one wins).

_orig_generate_tile_descriptions_sm90 = sm90_utils.generate_tile_descriptions_sm90


def _generate_tile_descriptions_sm90(math_instructions, is_aligned, level):
    out = []
    for mi in math_instructions:
        for td in _orig_generate_tile_descriptions_sm90([mi], is_aligned=is_aligned, level=level):
            td.fact_instruction_shape = list(mi.instruction_shape)
            out.append(td)

    def key(td):
        m = td.math_instruction
        return (m.element_a.value, m.element_b.value, m.element_accumulator.value,
                m.opcode_class.value, m.math_operation.value,
                list(td.threadblock_shape), list(td.cluster_shape),
                -td.fact_instruction_shape[1], list(td.fact_instruction_shape))
    out.sort(key=key)
    return out


gen.generate_tile_descriptions_sm90 = _generate_tile_descriptions_sm90


def builder_wgmma_shape(tile, element_bits):
    """The WGMMA shape the sm90 collective builder derives for a CTA tile (check only)."""
    n = next(n for n in range(256, 0, -8) if tile[1] % n == 0)
    return [64, n, 256 // element_bits]


# --------------------------------------------------------------------------------------------

def make_manifest(architectures, instantiation_level, build_dir):
    """Manifest args as generator.py's define_parser() builds them, for a kernels=all build."""
    args = gen.define_parser().parse_args([
        "--operations", "gemm",
        "--build-dir", build_dir,
        "--curr-build-dir", build_dir,
        "--generator-target", "library",
        "--architectures", architectures,
        "--kernels", "all",
        "--cuda-version", CUDA_VERSION,
        "--disable-full-archs-compilation",
        "--instantiation-level", instantiation_level,
        "--log-level", "warning",
    ])
    return Manifest(args)


def run_generators(manifest, names):
    for name in names:
        getattr(gen, name)(manifest, CUDA_VERSION)
    ops = []
    for by_cc in manifest.operations.get(OperationKind.Gemm, {}).values():
        for cfg in by_cc.values():
            ops.extend(cfg)
    return ops


def common_filter(op, kinds):
    if op.operation_kind != OperationKind.Gemm or op.gemm_kind not in kinds:
        return "kind"
    if op.A.complex_transform != ComplexTransform.none or op.B.complex_transform != ComplexTransform.none:
        return "complex"
    if getattr(op, "mixed_input_mode", None) is not None or op.A.element != op.B.element:
        return "mixed_input"
    if op.tile_description.math_instruction.element_accumulator != DataType.f32:
        return "acc_not_f32"
    if op.A.element not in (DataType.f32, DataType.bf16, DataType.f16):
        return "ab_storage_" + dtype_name(op.A.element)
    if op.D.element != op.A.element:
        return "d_ne_ab"
    if op.C.element not in (op.A.element, DataType.void):
        return "c_ne_ab"
    return None


def sm90_math(op):
    """tf32, bf16 or f16 for a plain multiply-add on matching data, else None (sm80 adds 3xTF32)."""
    mi = op.tile_description.math_instruction
    if mi.math_operation != MathOperation.multiply_add:
        return None
    if mi.element_a == DataType.tf32 and op.A.element == DataType.f32:
        return "tf32"
    if mi.element_a in (DataType.bf16, DataType.f16) and op.A.element == mi.element_a:
        return dtype_name(mi.element_a)
    return None


def sm80_math(op):
    mi = op.tile_description.math_instruction
    if mi.math_operation == MathOperation.multiply_add_fast_f32 and op.A.element == DataType.f32:
        return "tf32x3"
    return sm90_math(op)


def distill_sm90(ops, skipped, notes):
    rows = collections.defaultdict(set)
    for op in ops:
        why = common_filter(op, (GemmKind.Universal3x,))
        if why is None and skipped_schedule(op):
            why = "schedule"
        math = sm90_math(op) if why is None else None
        if why is None and math is None:
            why = "math"
        if why:
            skipped["sm90/" + why] += 1
            continue
        td = op.tile_description
        inst = list(getattr(td, "fact_instruction_shape", td.math_instruction.instruction_shape))
        if inst != builder_wgmma_shape(td.threadblock_shape, DataTypeSize[td.math_instruction.element_a]):
            notes.append(f"sm90 {op.procedural_name()}: generator WGMMA {inst} differs from builder pick")
        # Alignment of C/D as the emitter writes it (TMA epilogues use 16B TMA alignment of D;
        # with a void C the D alignment is the meaningful one).
        align_cd = (get_tma_alignment(op.D.element) if is_tma_epilogue(op.epilogue_schedule)
                    else op.D.alignment)
        key = (
            ("math", math),
            ("element", dtype_name(op.A.element)),
            ("tile", tuple(td.threadblock_shape)),
            ("instruction", tuple(inst)),
            ("cluster", tuple(td.cluster_shape)),
            ("kernel_schedule", kernel_schedule_name(op.kernel_schedule)),
            ("epilogue_schedule", epilogue_schedule_name(op.epilogue_schedule)),
            ("tile_scheduler", tile_scheduler_name(op.tile_scheduler)),
            ("stages", int(td.stages)),
            ("alignment", (int(op.A.alignment), int(op.B.alignment), int(align_cd))),
        )
        rows[key].add(layout_name(op.A.layout) + layout_name(op.B.layout))
    return finish(rows, ["math", "element", "tile", "instruction", "cluster", "kernel_schedule",
                         "epilogue_schedule", "tile_scheduler", "stages", "layouts", "alignment"])


def distill_sm80(ops, skipped):
    rows = collections.defaultdict(set)
    for op in ops:
        why = common_filter(op, (GemmKind.Universal, GemmKind.Gemm))
        math = sm80_math(op) if why is None else None
        if why is None and math is None:
            why = "math_" + op.tile_description.math_instruction.math_operation.name
        if why:
            skipped["sm80/" + why] += 1
            continue
        td = op.tile_description
        key = (
            ("math", math),
            ("element", dtype_name(op.A.element)),
            ("tile", tuple(td.threadblock_shape)),
            ("warp_count", tuple(td.warp_count)),
            ("instruction", tuple(td.math_instruction.instruction_shape)),
            ("stages", int(td.stages)),
            ("alignment", (int(op.A.alignment), int(op.B.alignment), int(op.C.alignment))),
        )
        rows[key].add(layout_name(op.A.layout) + layout_name(op.B.layout))
    return finish(rows, ["math", "element", "tile", "warp_count", "instruction", "stages",
                         "layouts", "alignment"])


MATH_ORDER = {"tf32": 0, "tf32x3": 1, "bf16": 2, "f16": 3}


def finish(rows, order):
    out = []
    for key, layouts in rows.items():
        d = dict(key)
        d["layouts"] = sorted(layouts)
        out.append({k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in order})

    def sort_key(r):
        return (MATH_ORDER.get(r["math"], 99), r["math"], r["element"],
                [r[k] for k in order if k not in ("math", "element")])
    out.sort(key=sort_key)
    return out


def dump(doc):
    """Deterministic JSON: header keys one per line, one row per line."""
    lines = ["{"]
    head = [k for k in doc if k not in ("sm90", "sm80")]
    for k in head:
        lines.append(f"  {json.dumps(k)}: {json.dumps(doc[k])},")
    for i, arch in enumerate(("sm90", "sm80")):
        rows = doc[arch]
        lines.append(f"  {json.dumps(arch)}: [")
        for j, r in enumerate(rows):
            lines.append("    " + json.dumps(r, separators=(", ", ": ")) + ("," if j + 1 < len(rows) else ""))
        lines.append("  ]" + ("," if i == 0 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    version = importlib.metadata.version("nvidia-cutlass")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="output path (default: knowledge/cutlass-<version>.json under the repo root)")
    ap.add_argument("--instantiation-level", default="",
                    help="CUTLASS sm90 instantiation level (default: each generator's own default "
                         "for a kernels=all build: 121 tf32, 131 16b, 101 alignx)")
    ap.add_argument("--verbose", action="store_true", help="print skip counts and notes")
    a = ap.parse_args()
    out = a.out or os.path.join(REPO_ROOT, "knowledge", f"cutlass-{version}.json")

    logging.basicConfig(level=logging.WARNING)
    skipped = collections.Counter()
    notes = []
    with tempfile.TemporaryDirectory(prefix="distill_cutlass_") as build_dir:
        # One manifest per arch so each op is checked against its own arch's shared-memory limit.
        m90 = make_manifest("90a", a.instantiation_level, build_dir)
        ops90 = run_generators(m90, SM90_GENERATORS)
        m80 = make_manifest("80", a.instantiation_level, build_dir)
        ops80 = run_generators(m80, SM80_GENERATORS)

    source = ("cutlass_library.generator (" + ", ".join(SM90_GENERATORS + SM80_GENERATORS) + "; "
              f"Manifest kernels=all, cuda {CUDA_VERSION}"
              + (f", instantiation_level {a.instantiation_level}" if a.instantiation_level else "")
              + ")")
    doc = {
        "format": 1,
        "cutlass_version": version,
        "source": source,
        "sm90": distill_sm90(ops90, skipped, notes),
        "sm80": distill_sm80(ops80, skipped),
    }
    text = dump(doc)
    json.loads(text)  # self-check
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)

    if a.verbose:
        for k in sorted(skipped):
            print(f"  skipped {k}: {skipped[k]}", file=sys.stderr)
        for n in notes:
            print("  note: " + n, file=sys.stderr)
    counts = collections.Counter()
    for arch in ("sm90", "sm80"):
        for r in doc[arch]:
            counts[(arch, r["math"])] += 1
    per = ", ".join(f"{arch}/{m}={counts[(arch, m)]}"
                    for arch in ("sm90", "sm80")
                    for m in sorted({m for (ar, m) in counts if ar == arch},
                                    key=lambda m: (MATH_ORDER.get(m, 99), m)))
    print(f"distill_cutlass: cutlass {version}: {len(ops90)}+{len(ops80)} generated ops -> "
          f"{len(doc['sm90'])} sm90 + {len(doc['sm80'])} sm80 rows ({per}); "
          f"{len(text)} bytes -> {out}")


if __name__ == "__main__":
    main()
