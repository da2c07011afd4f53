// Runs an AOTInductor package of a composed program from C++, without Python: loads fact's op
// library first (the package calls fact's ops through the dispatcher, by schema), then the
// package, and calls it on token ids below VOCAB (and, with `mask`, an all-ones padding mask
// beside them, as an encoder exported with its attention mask takes).
//
// Build against the libtorch the package was compiled with (./setup's venv here, the GPU
// machine's torch there):
//   T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
//   g++ -std=c++17 -O2 examples/aoti_run.cpp -I$T/include -I$T/include/torch/csrc/api/include \
//       -L$T/lib -Wl,-rpath,$T/lib -ltorch -ltorch_cpu -ltorch_cuda -lc10 -ldl -o aoti_run
// Run:
//   ./aoti_run out/gpt2/libfact_ops.so gpt2_aoti.pt2 8 1024 50257
//   ./aoti_run out/bert/libfact_ops.so bert_aoti.pt2 32 512 30522 mask
// It prints the output's shape and its checksum, and exits 1 with the error where any step fails.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 6 || argc > 7 || (argc == 7 && std::string(argv[6]) != "mask")) {
    std::fprintf(stderr, "usage: %s LIBFACT_OPS.so PACKAGE.pt2 BATCH SEQ VOCAB [mask]\n", argv[0]);
    return 2;
  }
  // RTLD_GLOBAL: the ops register with the dispatcher when the library loads.
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "cannot load the op library %s: %s\n", argv[1], dlerror());
    return 1;
  }
  try {
    torch::inductor::AOTIModelPackageLoader loader(argv[2]);
    const int64_t batch = std::atoll(argv[3]), seq = std::atoll(argv[4]), vocab = std::atoll(argv[5]);
    const auto ids = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
    std::vector<at::Tensor> inputs = {torch::randint(0, vocab, {batch, seq}, ids)};
    if (argc == 7) inputs.push_back(torch::ones({batch, seq}, ids));
    std::vector<at::Tensor> outputs = loader.run(inputs);
    const at::Tensor& out = outputs.at(0);
    std::printf("output %s, sum of |x| %.6g\n", c10::str(out.sizes()).c_str(), out.abs().sum().item<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
