// The native call path of te_compile's attention ops: their CUDA and Autograd kernels in C++.
//
// A call is one lookup of the runner for its signature (the spec string and each tensor's dtype, device,
// sizes, strides and 16-byte alignment), the allocations, and one execute of a cuDNN execution plan with a
// variant pack of raw pointers on PyTorch's current stream. Python builds each runner once
// (te_compile.cudnn.runners: the graph, the emitted score_mod, the decisions that depend only on the
// signature) and registers it here: the plan as the cuDNN backend serializes it, and every slot of its variant
// pack (an operand, a constant the frontend embedded, or a place in the workspace). A signature not held here
// goes to Python (the miss handlers), which serves the call and may register it.
//
// cuDNN is reached through the libcudnn.so.9 this process has loaded (torch's, or a preloaded newer one): the
// library the Python frontend built the plan with. Only cuDNN's C API is used (no C++ frontend, no iostreams).
//
// Replays: cuDNN's execute costs several times a kernel launch on the host. A runner that sees the same
// pointers again (a training loop's caching allocator hands each layer the same blocks step after step)
// captures its execute into a CUDA graph once, on a side stream, and from then on launches that graph for those
// pointers: the same kernels with the same arguments, for one cudaGraphLaunch. Calls on a capturing stream,
// and runners whose pointers keep changing, execute as before.

#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <dlfcn.h>
#include <link.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "interval_launch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

bool debug() {
    static bool on = std::getenv("TE_COMPILE_NATIVE_DEBUG") != nullptr;
    return on;
}

#define TE_DEBUG(msg)                                            \
    do {                                                         \
        if (debug()) std::fprintf(stderr, "te_compile native: %s\n", msg); \
    } while (0)


// Operand uids, as te_compile.cudnn.graphs.UID defines them (checked from Python at load: ``uids()``).
enum Uid : int64_t {
    UID_Q = 1, UID_K = 2, UID_V = 3, UID_BIAS = 4, UID_O = 100, UID_STATS = 101,
    UID_DO = 200, UID_DQ = 201, UID_DK = 202, UID_DV = 203, UID_DBIAS = 204,
    UID_INPUTS = 300, UID_CONSTS = 400,
};

// The parts, in order (each a concern of its own, one translation unit):
#include "native_key.h"
#include "native_runner.h"
#include "native_cudnn.h"
#include "native_replay.h"
#include "native_kernels.h"
#include "native_module.h"

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("init", &init, "bind the cuDNN library this process loaded; '' or why not");
    m.def("backend_version", &backend_version);
    m.def("install", &install, "register the CUDA and Autograd kernels of te_compile::attn_fwd / attn_bwd");
    m.def("uninstall", &uninstall);
    m.def("register_forward", &register_forward);
    m.def("register_backward", &register_backward);
    m.def("register_interval_forward", &register_interval_forward);
    m.def("register_interval_backward", &register_interval_backward);
    m.def("set_tvm_ffi", &set_tvm_ffi);
    m.def("block_checked", &block_checked);
    m.def("clear", &clear);
    m.def("forget", &forget, "drop the runners of one cuDNN graph (the owner id they were registered with)");
    m.def("stats", &stats);
    m.def("uids", &uids);
    m.def("set_replay", &set_replay);
    m.def("fail_next", &fail_next, "a test hook: the next n plan executes fail");
}
