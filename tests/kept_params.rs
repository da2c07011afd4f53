//! What an sm90 kernel keeps per call (templates/per_device.hbs, `kept_params`), without a GPU:
//! the partial rendered as the kernels render it, compiled by the host compiler around a fake
//! kernel whose Params record which call made them. Params are a call's TMA descriptors: one kept
//! for another call would have a kernel read and write another call's tensors.

use fact::codegen;
use fact::nvcc::Toolchain;
use std::process::Command;

const CHECK: &str = r#"
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>
#include "fact_kernels.h"

namespace k {
{{> per_device adapter=false kept=true}}
}  // namespace k

// A kernel whose Params say which make() made them.
struct Fake {
  struct Params {
    int made = 0;
  };
};

static int made = 0;
static k::CallKey key(int device, const FactOpArgs& a, const FactKnobs* knobs, const void* ws) {
  k::CallKey c;
  if (!k::device_call_key(device, &a, knobs, ws, c)) std::printf("no key\n");
  return c;
}
static int params(const k::CallKey* c) {
  return k::kept_params<Fake>(c, [] { return Fake::Params{++made}; }).made;
}
#define EXPECT(x) do { if (!(x)) { std::printf("failed: %s (line %d)\n", #x, __LINE__); return 1; } } while (0)

int main() {
  FactTensor t[2] = {};
  t[0].data = reinterpret_cast<void*>(0x10000);
  t[0].dtype = FACT_BF16;
  t[0].rank = 2;
  t[0].sizes[0] = 32; t[0].sizes[1] = 64;
  t[0].strides[0] = 64; t[0].strides[1] = 1;
  t[1] = t[0];
  t[1].data = reinterpret_cast<void*>(0x20000);
  const double scalars[1] = {0.125};
  FactOpArgs a{t, 2, scalars, 1};
  const FactKnobs knobs{1, 0, 0};
  void* ws = reinterpret_cast<void*>(0x30000);

  const k::CallKey first = key(0, a, &knobs, ws);
  const int p = params(&first);
  EXPECT(params(&first) == p);  // the same call: kept
  EXPECT(made == 1);
  // Any word of the call changes the key, and the Params.
  auto differs = [&](FactOpArgs b, const FactKnobs* kn, const void* w, int device) {
    const k::CallKey other = key(device, b, kn, w);
    const int before = made;
    return params(&other) != p && made == before + 1;
  };
  FactTensor u[2];
  u[0] = t[0]; u[1] = t[1]; u[1].data = reinterpret_cast<void*>(0x20100);
  EXPECT(differs(FactOpArgs{u, 2, scalars, 1}, &knobs, ws, 0));
  u[1] = t[1]; u[1].strides[0] = 128;
  EXPECT(differs(FactOpArgs{u, 2, scalars, 1}, &knobs, ws, 0));
  u[1] = t[1]; u[1].sizes[0] = 16;
  EXPECT(differs(FactOpArgs{u, 2, scalars, 1}, &knobs, ws, 0));
  u[1] = t[1]; u[1].dtype = FACT_F16;
  EXPECT(differs(FactOpArgs{u, 2, scalars, 1}, &knobs, ws, 0));
  const double other_scale[1] = {0.25};
  EXPECT(differs(FactOpArgs{t, 2, other_scale, 1}, &knobs, ws, 0));
  const FactKnobs split{2, 0, 0};
  EXPECT(differs(a, &split, ws, 0));
  EXPECT(differs(a, &knobs, reinterpret_cast<void*>(0x30100), 0));
  EXPECT(differs(a, &knobs, ws, 1));
  EXPECT(differs(FactOpArgs{t, 1, scalars, 1}, &knobs, ws, 0));
  // Still kept after those.
  EXPECT(params(&first) == p);
  // A call without a key is made each time.
  const int before = made;
  params(nullptr);
  params(nullptr);
  EXPECT(made == before + 2);
  // A forward's worth of calls (a kernel called once a layer), then each again: every one gets
  // its own Params back, made anew or kept, never another call's.
  int kept[48];
  FactTensor layer[48][2];
  for (int i = 0; i < 48; ++i) {
    layer[i][0] = t[0];
    layer[i][1] = t[1];
    layer[i][1].data = reinterpret_cast<void*>(0x100000 + 0x1000 * i);
    const k::CallKey c = key(0, FactOpArgs{layer[i], 2, scalars, 1}, &knobs, ws);
    kept[i] = params(&c);
  }
  const int after_first = made;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 48; ++i) {
      const k::CallKey c = key(0, FactOpArgs{layer[i], 2, scalars, 1}, &knobs, ws);
      const int before_call = made;
      const int got = params(&c);
      EXPECT(got == kept[i] || (got == made && made == before_call + 1));
      kept[i] = got;
    }
  }
  // Most of a forward's calls are kept (128 slots, two ways per hash).
  EXPECT(made - after_first < 48);
  std::printf("ok\n");
  return 0;
}
"#;

#[test]
fn a_kernel_keeps_params_per_call_and_never_hands_one_call_another_s() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let h = codegen::templates(&[codegen::PER_DEVICE], &[("check", CHECK)]);
    let source = h.render("check", &serde_json::json!({})).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("kept.cpp");
    std::fs::write(&src, source).unwrap();
    let exe = dir.path().join("kept");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("c++")
        .arg("-std=c++17")
        .arg("-O1")
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", tc.cuda_home.join("include").display()))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && said.trim() == "ok", "{said}");
}
