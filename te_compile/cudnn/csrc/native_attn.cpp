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
#include <execinfo.h>
#include <signal.h>

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

// --------------------------------------------------------------------------- signatures

struct Key {
    std::string spec;
    std::vector<int64_t> geo;
    bool operator==(Key const &o) const { return geo == o.geo && spec == o.spec; }
};

struct KeyHash {
    size_t operator()(Key const &k) const {
        size_t h = std::hash<std::string>()(k.spec);
        for (int64_t x : k.geo) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
        return h;
    }
};

inline void add_tensor(std::vector<int64_t> &g, Tensor const *t) {
    if (t == nullptr || !t->defined()) {
        g.push_back(-1);
        return;
    }
    g.push_back(static_cast<int64_t>(t->scalar_type()));
    g.push_back(static_cast<int64_t>(t->device().type()) * 1024 + t->device().index());
    g.push_back(t->dim());
    for (int64_t s : t->sizes()) g.push_back(s);
    for (int64_t s : t->strides()) g.push_back(s);
    g.push_back(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
}

Key fwd_key(Tensor const &q, Tensor const &k, Tensor const &v, OptTensor const &bias, at::TensorList extra,
            c10::string_view spec) {
    Key key{std::string(spec.data(), spec.size()), {}};
    key.geo.reserve(16 * (4 + extra.size()));
    key.geo.push_back(0);
    add_tensor(key.geo, &q);
    add_tensor(key.geo, &k);
    add_tensor(key.geo, &v);
    add_tensor(key.geo, bias ? &*bias : nullptr);
    for (auto const &t : extra) add_tensor(key.geo, &t);
    return key;
}

Key bwd_key(Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v, Tensor const &out,
            Tensor const &lse, OptTensor const &bias, at::TensorList extra, c10::string_view spec, bool need_dbias) {
    Key key{std::string(spec.data(), spec.size()), {}};
    key.geo.reserve(16 * (7 + extra.size()));
    key.geo.push_back(need_dbias ? 2 : 1);
    for (Tensor const *t : {&dout, &q, &k, &v, &out, &lse}) add_tensor(key.geo, t);
    add_tensor(key.geo, bias ? &*bias : nullptr);
    for (auto const &t : extra) add_tensor(key.geo, &t);
    return key;
}

// --------------------------------------------------------------------------- runners

struct PtrsHash {
    size_t operator()(std::vector<void *> const &v) const {
        size_t h = 1469598103934665603ull;
        for (void *p : v) h = (h ^ reinterpret_cast<uintptr_t>(p)) * 1099511628211ull;
        return h;
    }
};

// One slot of a plan's variant pack: an operand of the call (by uid), a constant, or a place in the workspace.
struct Slot {
    enum Kind { OPERAND, HOST, WORKSPACE, DATA } kind;
    int64_t uid;
    int64_t offset;  // HOST: index into Runner::host; WORKSPACE: byte offset; DATA: index into Runner::data
};

struct Runner {
    cudnnBackendDescriptor_t plan = nullptr;  // finalized execution plan, owned: destroyed with the runner
    c10::DeviceIndex device = 0;
    int64_t owner = 0;  // the cuDNN graph it runs (Python's id of it; 0: none): forget(owner) drops it
    int64_t workspace = 0;                    // bytes: the frontend's part first, then the engine's
    int64_t engine_offset = 0;                // where the engine's workspace starts
    std::vector<int64_t> uids;
    std::vector<Slot> slots;
    std::vector<std::array<uint8_t, 8>> host;  // pass-by-value constants, as the plan reads them
    std::vector<Tensor> data;                   // device copies of the data the frontend would copy per execute
    std::vector<std::pair<int64_t, int64_t>> zeroed;  // workspace (offset, bytes) zeroed before each execute
    int64_t n_inputs = 0;
    // forward
    std::vector<int64_t> out_shape, out_stride, lse_shape;
    Tensor rows;             // [1, 1, L] bool: rows the mask empties (undefined: none)
    bool bias_rows = false;  // look for rows the bias masks entirely, per call
    bool block = false;      // the call carries a BlockMask, which must be one Python checked
    std::vector<int64_t> bias_shape;  // the bias as the plan reads it, [1|B, 1|H, L, S]
    bool bias_copy = false;           // copied into a padded buffer each call (cuDNN cannot read it in place)
    // backward
    std::vector<std::vector<int64_t>> grad_strides;
    bool need_dbias = false;
    bool guard_lse = false;
    // replays (see the top of this file): guarded by ``replay_mutex``
    std::mutex replay_mutex;
    std::unordered_map<std::vector<void *>, int, PtrsHash> seen;  // pointer tuples seen once
    std::unordered_map<std::vector<void *>, cudaGraphExec_t, PtrsHash> graphs;
    int resets = 0;       // times ``graphs`` filled up and was emptied
    bool no_replay = false;  // capture failed, or the pointers keep changing
    std::atomic<bool> failed{false};  // an execute failed (warned once): calls go to Python
    // cuDNN's interval kernels (interval_launch.h) instead of a plan: their launches, and the (in i) inputs the mask
    // plan was built from, which a call must pass unchanged (same memory, same version) to run here
    std::shared_ptr<te_interval::Launches> launches;
    std::vector<Tensor> mask_inputs;
    std::vector<int64_t> mask_versions;
    ~Runner();
};

std::shared_mutex g_mutex;
// allocated once and never destroyed: a runner's destructor calls CUDA and cuDNN, which may be gone when a process's
// statics die
auto &g_fwd = *new std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash>();
auto &g_bwd = *new std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash>();
// BlockMasks Python has checked: (spec, B, H, L, S, then each BlockMask and input tensor's pointer, version,
// sizes and strides)
std::unordered_set<Key, KeyHash> g_blocks;
constexpr size_t kMaxRunners = 4096;
constexpr size_t kMaxBlocks = 1024;

std::atomic<int64_t> g_hits{0}, g_misses{0}, g_failed{0};
std::atomic<int64_t> g_plans{0};  // execution plan descriptors alive (created, not yet destroyed)

// Python callables (never freed: they must outlive every call, and Python may be finalizing when statics die)
py::object *g_fwd_miss = nullptr, *g_bwd_miss = nullptr, *g_grad_fwd = nullptr;

std::shared_ptr<Runner> find(std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash> &table, Key const &key) {
    std::shared_lock<std::shared_mutex> lock(g_mutex);
    auto it = table.find(key);
    return it == table.end() ? nullptr : it->second;
}

Key block_key(c10::string_view spec, Tensor const &q, Tensor const &k, at::TensorList extra) {
    Key key{std::string(spec.data(), spec.size()), {q.size(0), q.size(1), q.size(2), k.size(2)}};
    for (auto const &t : extra) {
        key.geo.push_back(reinterpret_cast<intptr_t>(t.data_ptr()));
        key.geo.push_back(static_cast<int64_t>(t._version()));
        for (int64_t s : t.sizes()) key.geo.push_back(s);
        key.geo.push_back(-2);
        for (int64_t s : t.strides()) key.geo.push_back(s);
        key.geo.push_back(-3);
    }
    return key;
}

bool block_known(c10::string_view spec, Tensor const &q, Tensor const &k, at::TensorList extra) {
    Key key = block_key(spec, q, k, extra);
    std::shared_lock<std::shared_mutex> lock(g_mutex);
    return g_blocks.count(key) > 0;
}

// --------------------------------------------------------------------------- cuDNN

struct Api {
    void *lib = nullptr;
    size_t (*get_version)() = nullptr;
    const char *(*error_string)(cudnnStatus_t) = nullptr;
    cudnnStatus_t (*create)(cudnnHandle_t *) = nullptr;
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
    cudnnStatus_t (*create_descriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *) = nullptr;
    cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                   cudnnBackendAttributeType_t, int64_t, const void *) = nullptr;
    cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                   cudnnBackendAttributeType_t, int64_t, int64_t *, void *) = nullptr;
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;
} api;

// The CUDA runtime torch loaded (found by symbol, so the extension links no cudart of its own); null members:
// no replays.
struct Cuda {
    decltype(&::cudaStreamIsCapturing) is_capturing = nullptr;
    decltype(&::cudaStreamCreateWithFlags) stream_create = nullptr;
    decltype(&::cudaStreamBeginCapture) begin_capture = nullptr;
    decltype(&::cudaStreamEndCapture) end_capture = nullptr;
    decltype(&::cudaGraphInstantiateWithFlags) instantiate = nullptr;
    decltype(&::cudaGraphLaunch) launch = nullptr;
    decltype(&::cudaGraphDestroy) graph_destroy = nullptr;
    decltype(&::cudaGraphExecDestroy) exec_destroy = nullptr;
    decltype(&::cudaGetLastError) last_error = nullptr;
    decltype(&::cudaMemsetAsync) memset = nullptr;  // required by runners with zeroed regions
    bool ok() const {
        return is_capturing && stream_create && begin_capture && end_capture && instantiate && launch &&
               graph_destroy && exec_destroy && last_error;
    }
} cuda;

std::atomic<bool> g_replay{true};
std::atomic<int64_t> g_replays{0}, g_captures{0};
constexpr size_t kMaxGraphs = 64;   // per runner
constexpr size_t kMaxSeen = 256;    // per runner
constexpr int kMaxResets = 4;       // then the runner executes only

bool capturing(cudaStream_t stream);

// Plans whose runner went while a CUDA graph was being captured (no device sync is allowed then): destroyed by the
// next runner that goes outside a capture.
std::mutex g_unreleased_mutex;
std::vector<std::pair<c10::DeviceIndex, cudnnBackendDescriptor_t>> g_unreleased;

void destroy_plan(c10::DeviceIndex device, cudnnBackendDescriptor_t plan) noexcept {
    if (cuda.is_capturing == nullptr || capturing(c10::cuda::getCurrentCUDAStream(device).stream())) {
        std::lock_guard<std::mutex> lock(g_unreleased_mutex);
        g_unreleased.emplace_back(device, plan);
        return;
    }
    std::vector<std::pair<c10::DeviceIndex, cudnnBackendDescriptor_t>> plans{{device, plan}};
    {
        std::lock_guard<std::mutex> lock(g_unreleased_mutex);
        plans.insert(plans.end(), g_unreleased.begin(), g_unreleased.end());
        g_unreleased.clear();
    }
    for (auto const &p : plans) {
        try {
            c10::cuda::CUDAGuard on(p.first);
            c10::cuda::device_synchronize();  // work a call queued with the plan finishes before the plan goes
        } catch (c10::Error const &) {
            continue;  // the device is in error: the plan stays (destroying it could free what a kernel still reads)
        }
        api.destroy_descriptor(p.second);
        g_plans--;
    }
}

// The last reference to a runner goes when it leaves its table and no call holds it any more.
Runner::~Runner() {
    if (cuda.exec_destroy)
        for (auto &kv : graphs) cuda.exec_destroy(kv.second);  // an in-flight launch completes first
    if (plan != nullptr && api.destroy_descriptor != nullptr) destroy_plan(device, plan);
}

std::string status_text(cudnnStatus_t st) {
    return std::to_string(static_cast<int>(st)) + " (" + (api.error_string ? api.error_string(st) : "?") + ")";
}

void check(cudnnStatus_t st, char const *what) {
    TORCH_CHECK(st == CUDNN_STATUS_SUCCESS, what, ": cuDNN status ", status_text(st));
}

cudnnHandle_t handle_for(c10::DeviceIndex device, cudaStream_t stream) {
    struct Bound {
        cudnnHandle_t handle = nullptr;
        cudaStream_t stream = nullptr;
    };
    thread_local std::unordered_map<int, Bound> handles;  // one per (thread, device), like te_compile.cudnn.graphs
    Bound &b = handles[device];
    if (b.handle == nullptr) {
        check(api.create(&b.handle), "cudnnCreate");
        b.stream = nullptr;
        check(api.set_stream(b.handle, nullptr), "cudnnSetStream");
    }
    if (b.stream != stream) {
        check(api.set_stream(b.handle, stream), "cudnnSetStream");
        b.stream = stream;
    }
    return b.handle;
}

void *operand_pointer(Runner const &r, int64_t uid, Tensor const *const *small, at::TensorList inputs) {
    if (uid >= UID_CONSTS) return nullptr;  // te_compile's constants are HOST slots
    if (uid >= UID_INPUTS) return inputs[uid - UID_INPUTS].data_ptr();
    int i = -1;
    switch (uid) {
        case UID_Q: i = 0; break;
        case UID_K: i = 1; break;
        case UID_V: i = 2; break;
        case UID_BIAS: i = 3; break;
        case UID_O: i = 4; break;
        case UID_STATS: i = 5; break;
        case UID_DO: i = 6; break;
        case UID_DQ: i = 7; break;
        case UID_DK: i = 8; break;
        case UID_DV: i = 9; break;
        case UID_DBIAS: i = 10; break;
        default: break;
    }
    return (i < 0 || small[i] == nullptr) ? nullptr : small[i]->data_ptr();
}

cudaStream_t side_stream(c10::DeviceIndex device) {
    thread_local std::unordered_map<int, cudaStream_t> streams;  // captures only: nothing runs on them
    auto it = streams.find(device);
    if (it != streams.end()) return it->second;
    cudaStream_t s = nullptr;
    if (cuda.stream_create(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cuda.last_error();
        s = nullptr;
    }
    return streams[device] = s;
}

// Zeroes the workspace regions the plan expects zeroed (the frontend's operation 1) on ``stream``.
bool zero(Runner const &r, char *base, cudaStream_t stream) {
    for (auto const &z : r.zeroed)
        if (cuda.memset(base + z.first, 0, static_cast<size_t>(z.second), stream) != cudaSuccess) {
            cuda.last_error();
            return false;
        }
    return true;
}

// Captures ``pack``'s execute into a CUDA graph on a side stream (nothing runs); null if cuDNN or CUDA refuse.
cudaGraphExec_t capture(Runner const &r, cudnnBackendDescriptor_t pack, char *base, c10::DeviceIndex device) {
    cudaStream_t side = side_stream(device);
    if (side == nullptr) return nullptr;
    cudnnHandle_t h = handle_for(device, side);
    if (cuda.begin_capture(side, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cuda.last_error();
        return nullptr;
    }
    bool ran = zero(r, base, side) && api.execute(h, r.plan, pack) == CUDNN_STATUS_SUCCESS;
    cudaGraph_t graph = nullptr;
    bool ended = cuda.end_capture(side, &graph) == cudaSuccess && graph != nullptr;
    cudaGraphExec_t exec = nullptr;
    if (ran && ended && cuda.instantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
    if (graph != nullptr) cuda.graph_destroy(graph);
    cuda.last_error();
    return ran && ended ? exec : nullptr;
}

enum class Replay { LAUNCHED, CAPTURE, EXECUTE };

// A graph for these pointers: launched (LAUNCHED); seen before, so capture it (CAPTURE); or execute (EXECUTE).
Replay replay(Runner &r, std::vector<void *> const &ptrs, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(r.replay_mutex);
    if (r.no_replay) return Replay::EXECUTE;
    auto g = r.graphs.find(ptrs);
    if (g != r.graphs.end()) {
        if (cuda.launch(g->second, stream) == cudaSuccess) return Replay::LAUNCHED;
        cuda.last_error();
        r.no_replay = true;
        return Replay::EXECUTE;
    }
    auto it = r.seen.find(ptrs);
    if (it != r.seen.end()) {
        r.seen.erase(it);
        return Replay::CAPTURE;
    }
    if (r.seen.size() >= kMaxSeen) r.seen.clear();
    r.seen.emplace(ptrs, 1);
    return Replay::EXECUTE;
}

void keep_graph(Runner &r, std::vector<void *> ptrs, cudaGraphExec_t exec) {
    std::lock_guard<std::mutex> lock(r.replay_mutex);
    if (exec == nullptr) {
        r.no_replay = true;
        return;
    }
    if (r.graphs.size() >= kMaxGraphs) {  // the pointers keep changing: start again, a few times at most
        for (auto &kv : r.graphs) cuda.exec_destroy(kv.second);
        r.graphs.clear();
        if (++r.resets >= kMaxResets) r.no_replay = true;
    }
    if (r.no_replay) {
        cuda.exec_destroy(exec);
        return;
    }
    auto [it, fresh] = r.graphs.emplace(std::move(ptrs), exec);
    if (!fresh) cuda.exec_destroy(exec);
}

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cuda.is_capturing(stream, &st) != cudaSuccess) {
        cuda.last_error();
        return true;  // unknown: treat as capturing (execute, as under CUDA graphs)
    }
    return st != cudaStreamCaptureStatusNone;
}

// Runs the plan; false (nothing launched) when cuDNN refuses, so the caller can hand the call to Python.
std::string status_text(char const *what, cudnnStatus_t st) {
    std::string s = std::string(what) + ": " + (api.error_string ? api.error_string(st) : "status");
    return s + " (" + std::to_string(static_cast<int>(st)) + ")";
}

// Runs ``r``'s plan on the call's tensors: "" when it ran, else what failed (cuDNN's status where cuDNN refused).
std::string execute(Runner &r, Tensor const &like, Tensor const *const *small, at::TensorList inputs) {
    constexpr int kMax = 48;
    int n = static_cast<int>(r.uids.size());
    if (n > kMax) return "the plan reads " + std::to_string(n) + " tensors (at most " + std::to_string(kMax) + ")";
    Tensor ws;
    if (r.workspace > 0) ws = at::empty({r.workspace}, like.options().dtype(at::kByte));
    char *base = r.workspace > 0 ? static_cast<char *>(ws.data_ptr()) : nullptr;
    std::vector<void *> ptrs(n + 1);
    for (int i = 0; i < n; i++) {
        Slot const &s = r.slots[i];
        if (s.kind == Slot::OPERAND) ptrs[i] = operand_pointer(r, s.uid, small, inputs);
        else if (s.kind == Slot::HOST) ptrs[i] = const_cast<uint8_t *>(r.host[s.offset].data());
        else if (s.kind == Slot::DATA) ptrs[i] = r.data[s.offset].data_ptr();
        else ptrs[i] = base + s.offset;
        if (ptrs[i] == nullptr) return "no tensor for the plan's uid " + std::to_string(s.uid);
    }
    void *engine_ws = base == nullptr ? nullptr : base + r.engine_offset;
    ptrs[n] = engine_ws;
    c10::DeviceIndex device = like.device().index();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    Replay how = Replay::EXECUTE;
    if (g_replay.load(std::memory_order_relaxed) && cuda.ok() && !capturing(stream)) {
        how = replay(r, ptrs, stream);
        if (how == Replay::LAUNCHED) {
            g_replays++;
            return "";
        }
    }
    cudnnBackendDescriptor_t pack = nullptr;
    cudnnStatus_t st = api.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st != CUDNN_STATUS_SUCCESS) return status_text("creating the variant pack", st);
    st = api.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data());
    if (st == CUDNN_STATUS_SUCCESS)
        st = api.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, r.uids.data());
    if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        api.destroy_descriptor(pack);
        return status_text("filling the variant pack", st);
    }
    if (how == Replay::CAPTURE) {
        cudaGraphExec_t exec = capture(r, pack, base, device);
        if (exec != nullptr && cuda.launch(exec, stream) == cudaSuccess) {
            keep_graph(r, std::move(ptrs), exec);
            g_captures++;
            api.destroy_descriptor(pack);
            return "";
        }
        cuda.last_error();
        if (exec != nullptr) cuda.exec_destroy(exec);
        keep_graph(r, {}, nullptr);  // this runner executes only
    }
    std::string error;
    if (!zero(r, base, stream)) error = "zeroing the plan's workspace (cudaMemsetAsync)";
    else if ((st = api.execute(handle_for(device, stream), r.plan, pack)) != CUDNN_STATUS_SUCCESS)
        error = status_text("cudnnBackendExecute", st);
    api.destroy_descriptor(pack);
    return error;
}

// A RuntimeWarning through Python's warnings module: a kernel the dispatcher calls from a compiled graph has no
// handler that turns c10's warnings into Python's, so TORCH_WARN would only reach stderr. Where Python refuses the
// warning (a filter that makes it an error), it goes to c10's handler instead.
void warn_in_python(std::string const &message) {
    py::gil_scoped_acquire gil;
    if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
        PyErr_Clear();
        TORCH_WARN(message);
    }
}

// A runner whose execute failed: warned once with what failed, and never tried again (its calls go to Python,
// which runs the same plan through the frontend and raises cuDNN's error if it fails there too).
void mark_failed(Runner &r, char const *direction, std::string const &error) {
    if (!r.failed.exchange(true)) {
        g_failed++;
        warn_in_python("te_compile: the native call path could not run a cuDNN " + std::string(direction) +
                       " plan (" + error + "); calls of this signature go through Python from now on");
    }
}

// A test hook: the next ``n`` executes fail as cuDNN would refuse them (te_compile.cudnn.native.fail_next).
std::atomic<int> g_fail_next{0};

std::string run_plan(Runner &r, Tensor const &like, Tensor const *const *small, at::TensorList inputs) {
    if (g_fail_next.load() > 0 && g_fail_next.fetch_sub(1) > 0)
        return status_text("cudnnBackendExecute (forced by te_compile.cudnn.native.fail_next)",
                           CUDNN_STATUS_EXECUTION_FAILED);
    return execute(r, like, small, inputs);
}

// rows padded to 16 bytes, as cuDNN reads and writes bias / dBias (te_compile.cudnn.graphs.padded_empty)
Tensor padded_empty(std::vector<int64_t> shape, at::TensorOptions const &options) {
    int64_t s = shape.back();
    shape.back() = (s + 7) / 8 * 8;
    return at::empty(shape, options).narrow(-1, 0, s);
}

// The bias as the plan reads it (te_compile.cudnn.graphs.bias_operand).
Tensor bias_operand(Runner const &r, OptTensor const &bias) {
    if (!bias) return Tensor();
    if (!r.bias_copy) return *bias;  // read in place: the same memory as its 4-D view
    Tensor b = *bias;
    while (b.dim() < 4) b = b.unsqueeze(0);
    b = b.expand(r.bias_shape);
    Tensor out = padded_empty(r.bias_shape, b.options());
    out.copy_(b);
    return out;
}

void fill_rows(Runner const &r, Tensor &out, Tensor &lse, OptTensor const &bias) {
    Tensor rows = r.rows;
    if (r.bias_rows && bias) {
        Tensor b = at::isneginf(*bias).all(-1);
        while (b.dim() < 3) b = b.unsqueeze(0);
        rows = rows.defined() ? at::logical_or(rows, b) : b;
    }
    if (rows.defined()) {
        out.masked_fill_(rows.unsqueeze(-1), 0.0);
        lse.masked_fill_(rows, -std::numeric_limits<double>::infinity());
    }
}

// --------------------------------------------------------------------------- the CUDA kernels

std::tuple<Tensor, Tensor> python_forward(Tensor const &q, Tensor const &k, Tensor const &v, OptTensor const &bias,
                                          at::TensorList extra, c10::string_view spec) {
    g_misses++;
    TE_DEBUG("forward call handed to Python (no runner for its signature, or a BlockMask not checked yet)");
    py::gil_scoped_acquire gil;
    py::object res = (*g_fwd_miss)(q, k, v, bias, std::vector<Tensor>(extra.begin(), extra.end()),
                                std::string(spec.data(), spec.size()));
    return res.cast<std::tuple<Tensor, Tensor>>();
}

// --------------------------------------------------------------------------- cuDNN's interval kernels

// Set when a launch of the interval kernels failed: every such signature goes back to Python, which launches
// them through the frontend's Python and raises its error (no runner is registered again).
std::atomic<bool> g_interval_off{false};

bool same_mask_inputs(Runner const &r, at::TensorList inputs) {
    if (inputs.size() != r.mask_inputs.size()) return false;
    for (size_t i = 0; i < inputs.size(); i++)
        if (inputs[i].data_ptr() != r.mask_inputs[i].data_ptr() ||
            static_cast<int64_t>(inputs[i]._version()) != r.mask_versions[i])
            return false;
    return true;
}

Tensor in_layout(Tensor t, std::vector<int64_t> const &stride) {
    if (t.strides() == c10::IntArrayRef(stride)) return t;
    Tensor o = at::empty_strided(t.sizes(), stride, t.options());
    o.copy_(t);
    return o;
}

// Python serves calls under CUDA graph capture (the kernels are not captured: te_compile.cudnn.flexkernel) and where
// capture cannot be detected.
bool interval_capturing(Tensor const &q) {
    return cuda.is_capturing == nullptr || capturing(c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
}

std::vector<Tensor> run_interval(Runner const &r, std::vector<Tensor> operands, c10::Device device) {
    std::string error;
    auto outs = te_interval::run(*r.launches, std::move(operands), device, error);
    if (outs.empty() && !g_interval_off.exchange(true))
        warn_in_python("te_compile: a C++ launch of cuDNN's interval kernels failed (" + error +
                       "); these calls go through the frontend's Python from now on");
    return outs;
}

std::tuple<Tensor, Tensor> fwd_cuda(Tensor const &q, Tensor const &k, Tensor const &v, OptTensor const &bias,
                                    at::TensorList extra, c10::string_view spec) {
    auto r = find(g_fwd, fwd_key(q, k, v, bias, extra, spec));
    if (!r || r->failed || (r->block && !block_known(spec, q, k, extra)))
        return python_forward(q, k, v, bias, extra, spec);
    c10::cuda::CUDAGuard guard(q.device());
    if (r->launches) {
        if (g_interval_off || interval_capturing(q) || !same_mask_inputs(*r, extra.slice(0, r->n_inputs)))
            return python_forward(q, k, v, bias, extra, spec);
        auto outs = run_interval(*r, {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)}, q.device());
        if (outs.size() != 2) return python_forward(q, k, v, bias, extra, spec);
        Tensor out = in_layout(outs[0].transpose(1, 2), r->out_stride);
        Tensor lse = outs[1].contiguous();
        if (r->rows.defined()) fill_rows(*r, out, lse, bias);
        g_hits++;
        return {out, lse};
    }
    Tensor out = at::empty_strided(r->out_shape, r->out_stride, q.options());
    Tensor lse = at::empty(r->lse_shape, q.options().dtype(at::kFloat));
    Tensor b4 = bias_operand(*r, bias);
    Tensor const *small[11] = {&q, &k, &v, bias ? &b4 : nullptr, &out, &lse, nullptr, nullptr, nullptr, nullptr,
                               nullptr};
    std::string error = run_plan(*r, q, small, extra.slice(0, r->n_inputs));
    if (!error.empty()) {
        mark_failed(*r, "forward", error);
        return python_forward(q, k, v, bias, extra, spec);
    }
    if (r->rows.defined() || r->bias_rows) fill_rows(*r, out, lse, bias);
    g_hits++;
    return {out, lse};
}

using Grads = std::tuple<Tensor, Tensor, Tensor, Tensor>;

Grads python_backward(Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v, Tensor const &out,
                      Tensor const &lse, OptTensor const &bias, at::TensorList extra, c10::string_view spec,
                      bool need_dbias, OptTensor const &dlse) {
    g_misses++;
    TE_DEBUG("backward call handed to Python (no runner for its signature, or a dlse)");
    py::gil_scoped_acquire gil;
    py::object res = (*g_bwd_miss)(dout, q, k, v, out, lse, bias, std::vector<Tensor>(extra.begin(), extra.end()),
                                std::string(spec.data(), spec.size()), need_dbias, dlse);
    return res.cast<Grads>();
}

Grads bwd_cuda(Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v, Tensor const &out,
               Tensor const &lse, OptTensor const &bias, at::TensorList extra, c10::string_view spec, bool need_dbias,
               OptTensor const &dlse) {
    std::shared_ptr<Runner> r;
    if (!dlse) r = find(g_bwd, bwd_key(dout, q, k, v, out, lse, bias, extra, spec, need_dbias));
    if (!r || r->failed) return python_backward(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse);
    c10::cuda::CUDAGuard guard(q.device());
    if (r->launches) {
        if (g_interval_off || interval_capturing(q) || !same_mask_inputs(*r, extra.slice(0, r->n_inputs)))
            return python_backward(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse);
        Tensor stats = (r->guard_lse ? at::nan_to_num(lse, std::numeric_limits<double>::quiet_NaN(),
                                                      std::numeric_limits<double>::infinity(), 1e30)
                                     : lse).contiguous();
        auto outs = run_interval(*r, {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out.transpose(1, 2),
                                      dout.transpose(1, 2), stats, Tensor()}, q.device());
        if (outs.size() != 3) return python_backward(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse);
        g_hits++;
        return {in_layout(outs[0].transpose(1, 2), r->grad_strides[0]), in_layout(outs[1].transpose(1, 2), r->grad_strides[1]),
                in_layout(outs[2].transpose(1, 2), r->grad_strides[2]), q.new_empty({0})};
    }
    Tensor stats = r->guard_lse ? at::nan_to_num(lse, std::numeric_limits<double>::quiet_NaN(),
                                                       std::numeric_limits<double>::infinity(), 1e30)
                                : lse;
    Tensor dq = at::empty_strided(q.sizes(), r->grad_strides[0], q.options());
    Tensor dk = at::empty_strided(k.sizes(), r->grad_strides[1], k.options());
    Tensor dv = at::empty_strided(v.sizes(), r->grad_strides[2], v.options());
    Tensor b4 = bias_operand(*r, bias);
    Tensor dbias4 = r->need_dbias ? padded_empty(r->bias_shape, q.options()) : Tensor();
    Tensor const *small[11] = {&q, &k, &v, bias ? &b4 : nullptr, &out, &stats, &dout, &dq, &dk, &dv,
                               r->need_dbias ? &dbias4 : nullptr};
    std::string error = run_plan(*r, q, small, extra.slice(0, r->n_inputs));
    if (!error.empty()) {
        mark_failed(*r, "backward", error);
        return python_backward(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse);
    }
    g_hits++;
    // summed over the dims the bias broadcasts, in the bias's dtype (te_compile.cudnn.graphs.dbias_of)
    Tensor db = r->need_dbias
                    ? dbias4.sum_to_size(bias->sizes()).reshape(bias->sizes()).to(bias->scalar_type()).contiguous()
                    : q.new_empty({0});
    return {dq, dk, dv, db};
}

// --------------------------------------------------------------------------- the Autograd kernels

bool any_requires_grad(std::initializer_list<Tensor const *> ts, OptTensor const &bias, at::TensorList extra) {
    for (auto t : ts)
        if (t->requires_grad()) return true;
    if (bias && bias->requires_grad()) return true;
    for (auto const &t : extra)
        if (t.requires_grad()) return true;
    return false;
}

using FwdSig = std::tuple<Tensor, Tensor>(Tensor const &, Tensor const &, Tensor const &, OptTensor const &,
                                          at::TensorList, c10::string_view);
using BwdSig = Grads(Tensor const &, Tensor const &, Tensor const &, Tensor const &, Tensor const &, Tensor const &,
                     OptTensor const &, at::TensorList, c10::string_view, bool, OptTensor const &);

std::tuple<Tensor, Tensor> fwd_autograd(c10::DispatchKeySet ks, Tensor const &q, Tensor const &k, Tensor const &v,
                                        OptTensor const &bias, at::TensorList extra, c10::string_view spec) {
    if (at::GradMode::is_enabled() && any_requires_grad({&q, &k, &v}, bias, extra)) {
        // recording autograd history: te_compile's autograd.Function (Python), as without the native path
        py::gil_scoped_acquire gil;
        py::object res = (*g_grad_fwd)(q, k, v, bias, std::vector<Tensor>(extra.begin(), extra.end()),
                                    std::string(spec.data(), spec.size()));
        return res.cast<std::tuple<Tensor, Tensor>>();
    }
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("te_compile::attn_fwd", "").typed<FwdSig>();
    return op.redispatch(ks & c10::after_autograd_keyset, q, k, v, bias, extra, spec);
}

Grads bwd_autograd(c10::DispatchKeySet ks, Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v,
                   Tensor const &out, Tensor const &lse, OptTensor const &bias, at::TensorList extra,
                   c10::string_view spec, bool need_dbias, OptTensor const &dlse) {
    if (at::GradMode::is_enabled() &&
        (any_requires_grad({&dout, &q, &k, &v, &out, &lse}, bias, extra) || (dlse && dlse->requires_grad()))) {
        TORCH_CHECK(false, "te_compile: double backward (create_graph=True) through a te_compile attention op is "
                           "not supported; compile this model without te_compile for higher-order gradients");
    }
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("te_compile::attn_bwd", "").typed<BwdSig>();
    return op.redispatch(ks & c10::after_autograd_keyset, dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse);
}

std::unique_ptr<torch::Library> g_cuda_lib, g_autograd_lib;

// --------------------------------------------------------------------------- Python interface

void on_segv(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    for (int i = 0; i < n; i++) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_fname)
            std::fprintf(stderr, "  #%d %s +0x%lx (%s)\n", i, info.dli_fname,
                         (unsigned long)((char *)frames[i] - (char *)info.dli_fbase), info.dli_sname ? info.dli_sname : "?");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void *cuda_symbol(char const *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (p != nullptr) return p;
    static void *lib = [] {  // torch's libcudart, loaded locally: find it in the process's maps
        void *h = nullptr;
        if (FILE *f = std::fopen("/proc/self/maps", "r")) {
            char line[4096];
            while (h == nullptr && std::fgets(line, sizeof line, f)) {
                char *path = std::strchr(line, '/');
                if (path == nullptr || std::strstr(path, "libcudart.so") == nullptr) continue;
                path[std::strcspn(path, "\n")] = 0;
                h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
            }
            std::fclose(f);
        }
        return h;
    }();
    return lib ? dlsym(lib, name) : nullptr;
}

void bind_cuda() {
    Cuda c;
    c.is_capturing = reinterpret_cast<decltype(c.is_capturing)>(cuda_symbol("cudaStreamIsCapturing"));
    c.stream_create = reinterpret_cast<decltype(c.stream_create)>(cuda_symbol("cudaStreamCreateWithFlags"));
    c.begin_capture = reinterpret_cast<decltype(c.begin_capture)>(cuda_symbol("cudaStreamBeginCapture"));
    c.end_capture = reinterpret_cast<decltype(c.end_capture)>(cuda_symbol("cudaStreamEndCapture"));
    c.instantiate = reinterpret_cast<decltype(c.instantiate)>(cuda_symbol("cudaGraphInstantiateWithFlags"));
    c.launch = reinterpret_cast<decltype(c.launch)>(cuda_symbol("cudaGraphLaunch"));
    c.graph_destroy = reinterpret_cast<decltype(c.graph_destroy)>(cuda_symbol("cudaGraphDestroy"));
    c.exec_destroy = reinterpret_cast<decltype(c.exec_destroy)>(cuda_symbol("cudaGraphExecDestroy"));
    c.last_error = reinterpret_cast<decltype(c.last_error)>(cuda_symbol("cudaGetLastError"));
    c.memset = reinterpret_cast<decltype(c.memset)>(cuda_symbol("cudaMemsetAsync"));
    if (c.ok()) cuda = c;
    else cuda.memset = c.memset;
}

std::string init(std::string const &cudnn_path) {
    if (debug()) signal(SIGSEGV, on_segv);
    if (api.lib != nullptr) return "";
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr && !cudnn_path.empty()) h = dlopen(cudnn_path.c_str(), RTLD_NOW);
    if (h == nullptr) return "libcudnn.so.9 is not loaded in this process";
    Api a;
    a.lib = h;
    auto get = [h](char const *name) { return dlsym(h, name); };
    a.get_version = reinterpret_cast<size_t (*)()>(get("cudnnGetVersion"));
    a.error_string = reinterpret_cast<const char *(*)(cudnnStatus_t)>(get("cudnnGetErrorString"));
    a.create = reinterpret_cast<decltype(a.create)>(get("cudnnCreate"));
    a.set_stream = reinterpret_cast<decltype(a.set_stream)>(get("cudnnSetStream"));
    a.create_descriptor = reinterpret_cast<decltype(a.create_descriptor)>(get("cudnnBackendCreateDescriptor"));
    a.destroy_descriptor = reinterpret_cast<decltype(a.destroy_descriptor)>(get("cudnnBackendDestroyDescriptor"));
    a.set_attribute = reinterpret_cast<decltype(a.set_attribute)>(get("cudnnBackendSetAttribute"));
    a.get_attribute = reinterpret_cast<decltype(a.get_attribute)>(get("cudnnBackendGetAttribute"));
    a.finalize = reinterpret_cast<decltype(a.finalize)>(get("cudnnBackendFinalize"));
    a.execute = reinterpret_cast<decltype(a.execute)>(get("cudnnBackendExecute"));
    if (!a.get_version || !a.error_string || !a.create || !a.set_stream || !a.create_descriptor ||
        !a.destroy_descriptor || !a.set_attribute || !a.get_attribute || !a.finalize || !a.execute)
        return "libcudnn.so.9 lacks a backend API function";
    api = a;
    bind_cuda();
    return "";
}

int64_t backend_version() { return api.get_version ? static_cast<int64_t>(api.get_version()) : 0; }

void install(py::object fwd_miss, py::object bwd_miss, py::object grad_fwd) {
    g_fwd_miss = new py::object(std::move(fwd_miss));
    g_bwd_miss = new py::object(std::move(bwd_miss));
    g_grad_fwd = new py::object(std::move(grad_fwd));
    g_cuda_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "te_compile",
                                                  std::optional<c10::DispatchKey>(c10::DispatchKey::CUDA), __FILE__,
                                                  __LINE__);
    g_cuda_lib->impl("attn_fwd", TORCH_FN(fwd_cuda));
    g_cuda_lib->impl("attn_bwd", TORCH_FN(bwd_cuda));
    g_autograd_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "te_compile",
                                                      std::optional<c10::DispatchKey>(c10::DispatchKey::Autograd),
                                                      __FILE__, __LINE__);
    g_autograd_lib->impl("attn_fwd", TORCH_FN(fwd_autograd));
    g_autograd_lib->impl("attn_bwd", TORCH_FN(bwd_autograd));
}

void uninstall() {
    g_cuda_lib.reset();
    g_autograd_lib.reset();
}

// A runner for a plan the cuDNN backend serialized (its JSON), and the plan's variant pack: ``uids`` with, per
// uid, its kind (te_compile.cudnn.plan_blob: 0 operand, 1 host constant, 2 workspace, 3 data, 4 zeroed workspace),
// its payload (host: the constant's bytes, at most 8; data: its bytes; zeroed: the byte count as int64) and its
// offset (workspace, zeroed: bytes into the frontend's part of the workspace).
std::shared_ptr<Runner> load_runner(std::string const &plan_json, int64_t device, std::vector<int64_t> const &uids,
                                    std::vector<int64_t> const &kinds, std::vector<py::bytes> const &payloads,
                                    std::vector<int64_t> const &offsets, int64_t fe_workspace, int64_t n_inputs,
                                    std::vector<double> const &consts) {
    TORCH_CHECK(api.lib != nullptr, "te_compile native: not initialized");
    TORCH_CHECK(uids.size() == kinds.size() && uids.size() == payloads.size() && uids.size() == offsets.size(),
                "variant pack lists of different lengths");
    auto r = std::make_shared<Runner>();
    TE_DEBUG("load_runner: handle");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    cudnnHandle_t h = handle_for(static_cast<c10::DeviceIndex>(device), stream.stream());
    TE_DEBUG("load_runner: plan");
    r->device = static_cast<c10::DeviceIndex>(device);
    check(api.create_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &r->plan), "create execution plan");
    g_plans++;
    check(api.set_attribute(r->plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                            static_cast<int64_t>(plan_json.size()), plan_json.data()),
          "set the plan's JSON");
    check(api.set_attribute(r->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h), "set the plan's handle");
    check(api.finalize(r->plan), "finalize the plan");
    int64_t engine_ws = 0, count = 0;
    check(api.get_attribute(r->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &engine_ws),
          "the plan's workspace size");
    TE_DEBUG("load_runner: slots");
    r->engine_offset = fe_workspace;
    r->workspace = fe_workspace + engine_ws;
    r->n_inputs = n_inputs;
    for (double c : consts) {
        std::array<uint8_t, 8> b{};
        float f = static_cast<float>(c);
        std::memcpy(b.data(), &f, sizeof f);
        r->host.push_back(b);
    }
    for (size_t i = 0; i < uids.size(); i++) {
        int64_t uid = uids[i];
        Slot s{Slot::OPERAND, uid, 0};
        if (kinds[i] == 1) {
            std::string bytes = payloads[i];
            TORCH_CHECK(bytes.size() <= 8, "a constant wider than 8 bytes (uid ", uid, ")");
            std::array<uint8_t, 8> b{};
            std::memcpy(b.data(), bytes.data(), bytes.size());
            s = Slot{Slot::HOST, uid, static_cast<int64_t>(r->host.size())};
            r->host.push_back(b);
        } else if (kinds[i] == 2 || kinds[i] == 4) {
            TORCH_CHECK(offsets[i] >= 0 && offsets[i] < std::max<int64_t>(fe_workspace, 1),
                        "a workspace slot outside the frontend's workspace (uid ", uid, ")");
            s = Slot{Slot::WORKSPACE, uid, offsets[i]};
            if (kinds[i] == 4) {
                std::string bytes = payloads[i];
                int64_t n = 0;
                TORCH_CHECK(bytes.size() == 8, "a zeroed workspace slot without its size");
                std::memcpy(&n, bytes.data(), 8);
                TORCH_CHECK(n >= 0 && offsets[i] + n <= fe_workspace,
                            "a zeroed workspace region outside the frontend's workspace");
                TORCH_CHECK(cuda.memset != nullptr, "cudaMemsetAsync not found in this process");
                r->zeroed.emplace_back(offsets[i], n);
            }
        } else if (kinds[i] == 3) {
            std::string bytes = payloads[i];
            Tensor host = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
            std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
            s = Slot{Slot::DATA, uid, static_cast<int64_t>(r->data.size())};
            r->data.push_back(host.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))));
        } else if (uid >= UID_CONSTS && uid - UID_CONSTS < static_cast<int64_t>(consts.size())) {
            s = Slot{Slot::HOST, uid, uid - UID_CONSTS};
        } else {
            bool known = (uid >= UID_INPUTS && uid < UID_CONSTS && uid - UID_INPUTS < n_inputs) || uid == UID_Q ||
                         uid == UID_K || uid == UID_V || uid == UID_BIAS || uid == UID_O || uid == UID_STATS ||
                         uid == UID_DO || uid == UID_DQ || uid == UID_DK || uid == UID_DV || uid == UID_DBIAS;
            TORCH_CHECK(known, "the plan reads an operand te_compile does not pass (uid ", uid, ")");
        }
        r->uids.push_back(uid);
        r->slots.push_back(s);
    }
    TORCH_CHECK(r->uids.size() <= 48, "too many variant pack slots");
    TE_DEBUG("load_runner: done");
    return r;
}

void remember(std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash> &table, Key key, std::shared_ptr<Runner> r) {
    std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash> full;  // destroyed after the lock is released
    std::unique_lock<std::shared_mutex> lock(g_mutex);
    if (table.size() >= kMaxRunners) full.swap(table);
    table[std::move(key)] = std::move(r);
}

void register_forward(Tensor const &q, Tensor const &k, Tensor const &v, OptTensor const &bias,
                      std::vector<Tensor> const &extra, std::string const &spec, int64_t owner,
                      std::string const &plan_json,
                      std::vector<int64_t> const &uids, std::vector<int64_t> const &kinds,
                      std::vector<py::bytes> const &payloads, std::vector<int64_t> const &offsets, int64_t fe_workspace,
                      int64_t n_inputs, std::vector<double> const &consts, std::vector<int64_t> out_shape,
                      std::vector<int64_t> out_stride, std::vector<int64_t> bias_shape, bool bias_copy, OptTensor rows,
                      bool bias_rows, bool block) {
    auto r = load_runner(plan_json, q.device().index(), uids, kinds, payloads, offsets, fe_workspace, n_inputs, consts);
    r->owner = owner;
    r->out_shape = std::move(out_shape);
    r->out_stride = std::move(out_stride);
    r->lse_shape = {r->out_shape[0], r->out_shape[1], r->out_shape[2]};
    r->bias_shape = std::move(bias_shape);
    r->bias_copy = bias_copy;
    if (rows) r->rows = *rows;
    r->bias_rows = bias_rows;
    r->block = block;
    remember(g_fwd, fwd_key(q, k, v, bias, extra, spec), std::move(r));
}

void register_backward(Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v, Tensor const &out,
                       Tensor const &lse, OptTensor const &bias, std::vector<Tensor> const &extra,
                       std::string const &spec, bool need_dbias, int64_t owner, std::string const &plan_json,
                       std::vector<int64_t> const &uids, std::vector<int64_t> const &kinds,
                       std::vector<py::bytes> const &payloads, std::vector<int64_t> const &offsets,
                       int64_t fe_workspace, int64_t n_inputs, std::vector<double> const &consts,
                       std::vector<std::vector<int64_t>> grad_strides, bool plan_dbias, std::vector<int64_t> bias_shape,
                       bool bias_copy, bool guard) {
    TORCH_CHECK(grad_strides.size() == 3, "three gradient layouts expected");
    auto r = load_runner(plan_json, q.device().index(), uids, kinds, payloads, offsets, fe_workspace, n_inputs, consts);
    r->owner = owner;
    r->grad_strides = std::move(grad_strides);
    r->need_dbias = plan_dbias;
    r->bias_shape = std::move(bias_shape);
    r->bias_copy = bias_copy;
    r->guard_lse = guard;
    remember(g_bwd, bwd_key(dout, q, k, v, out, lse, bias, extra, spec, need_dbias), std::move(r));
}

// The recorded launches of cuDNN's interval kernels (te_compile.cudnn.flexlaunch.native_form): per launch the
// TVM-FFI function handle and its arguments as parallel lists (kind, integer, float; interval_launch.h's Arg), the
// plan's tensors, the buffers (shape, strides, a tensor of their dtype, zeroed), the operand count and output slots.
std::shared_ptr<te_interval::Launches> load_launches(std::vector<int64_t> const &funcs,
                                                      std::vector<std::vector<int64_t>> const &kinds,
                                                      std::vector<std::vector<int64_t>> const &ints,
                                                      std::vector<std::vector<double>> const &floats,
                                                      std::vector<Tensor> const &consts,
                                                      std::vector<std::vector<int64_t>> const &shapes,
                                                      std::vector<std::vector<int64_t>> const &strides,
                                                      std::vector<Tensor> const &dtypes, std::vector<bool> const &zero,
                                                      int64_t n_operands, std::vector<int64_t> const &outputs) {
    TORCH_CHECK(te_interval::ffi().ok(), "te_compile native: TVM-FFI's C functions are not set (set_tvm_ffi)");
    TORCH_CHECK(funcs.size() == kinds.size() && kinds.size() == ints.size() && ints.size() == floats.size(),
                "launch lists of different lengths");
    TORCH_CHECK(shapes.size() == strides.size() && shapes.size() == dtypes.size() && shapes.size() == zero.size(),
                "buffer lists of different lengths");
    auto l = std::make_shared<te_interval::Launches>();
    int64_t n_slots = n_operands + static_cast<int64_t>(shapes.size());
    for (size_t c = 0; c < funcs.size(); c++) {
        TORCH_CHECK(kinds[c].size() == ints[c].size() && kinds[c].size() == floats[c].size(), "argument lists differ");
        std::vector<te_interval::Arg> args;
        for (size_t j = 0; j < kinds[c].size(); j++) {
            te_interval::Arg a{static_cast<te_interval::Arg::Kind>(kinds[c][j]), ints[c][j], floats[c][j]};
            TORCH_CHECK(kinds[c][j] >= 0 && kinds[c][j] <= 6, "unknown argument kind ", kinds[c][j]);
            TORCH_CHECK(a.kind != te_interval::Arg::SLOT || (a.i >= 0 && a.i < n_slots), "slot out of range");
            TORCH_CHECK(a.kind != te_interval::Arg::CONST || (a.i >= 0 && a.i < static_cast<int64_t>(consts.size())),
                        "constant out of range");
            args.push_back(a);
        }
        for (auto const &a : args)
            if (a.kind == te_interval::Arg::ARRAY) l->hold(reinterpret_cast<void *>(static_cast<uintptr_t>(a.i)));
        l->funcs.push_back(reinterpret_cast<void *>(static_cast<uintptr_t>(funcs[c])));
        l->hold(l->funcs.back());
        l->args.push_back(std::move(args));
    }
    for (auto const &t : consts) TORCH_CHECK(t.is_cuda(), "a plan tensor off the GPU");
    l->consts = consts;
    for (size_t b = 0; b < shapes.size(); b++)
        l->buffers.push_back({shapes[b], strides[b], dtypes[b].scalar_type(), static_cast<bool>(zero[b])});
    l->n_operands = n_operands;
    for (int64_t o : outputs) TORCH_CHECK(o >= 0 && o < n_slots, "output slot out of range");
    l->outputs = outputs;
    return l;
}

std::shared_ptr<Runner> interval_runner(std::shared_ptr<te_interval::Launches> l, std::vector<Tensor> const &data,
                                        int64_t n_inputs, OptTensor rows) {
    auto r = std::make_shared<Runner>();
    r->launches = std::move(l);
    r->n_inputs = n_inputs;
    r->mask_inputs = data;
    for (auto const &t : data) r->mask_versions.push_back(static_cast<int64_t>(t._version()));
    if (rows) r->rows = *rows;
    return r;
}

bool register_interval_forward(Tensor const &q, Tensor const &k, Tensor const &v, OptTensor const &bias,
                               std::vector<Tensor> const &extra, std::string const &spec, py::tuple form,
                               std::vector<int64_t> out_stride, OptTensor rows, std::vector<Tensor> const &data,
                               int64_t n_inputs, bool block) {
    if (g_interval_off) return false;
    TORCH_CHECK(form.size() == 11, "an interval launch form has 11 parts");
    auto l = load_launches(form[0].cast<std::vector<int64_t>>(), form[1].cast<std::vector<std::vector<int64_t>>>(),
                           form[2].cast<std::vector<std::vector<int64_t>>>(), form[3].cast<std::vector<std::vector<double>>>(),
                           form[4].cast<std::vector<Tensor>>(), form[5].cast<std::vector<std::vector<int64_t>>>(),
                           form[6].cast<std::vector<std::vector<int64_t>>>(), form[7].cast<std::vector<Tensor>>(),
                           form[8].cast<std::vector<bool>>(), form[9].cast<int64_t>(), form[10].cast<std::vector<int64_t>>());
    TORCH_CHECK(l->n_operands == 3 && l->outputs.size() == 2, "a forward takes q, k, v and gives out, lse");
    auto r = interval_runner(std::move(l), data, n_inputs, rows);
    r->out_stride = std::move(out_stride);
    r->block = block;
    remember(g_fwd, fwd_key(q, k, v, bias, extra, spec), std::move(r));
    return true;
}

bool register_interval_backward(Tensor const &dout, Tensor const &q, Tensor const &k, Tensor const &v,
                                Tensor const &out, Tensor const &lse, OptTensor const &bias,
                                std::vector<Tensor> const &extra, std::string const &spec, bool need_dbias,
                                py::tuple form, std::vector<std::vector<int64_t>> grad_strides, bool guard,
                                std::vector<Tensor> const &data, int64_t n_inputs) {
    if (g_interval_off) return false;
    TORCH_CHECK(form.size() == 11 && grad_strides.size() == 3, "an interval launch form has 11 parts, 3 gradient layouts");
    auto l = load_launches(form[0].cast<std::vector<int64_t>>(), form[1].cast<std::vector<std::vector<int64_t>>>(),
                           form[2].cast<std::vector<std::vector<int64_t>>>(), form[3].cast<std::vector<std::vector<double>>>(),
                           form[4].cast<std::vector<Tensor>>(), form[5].cast<std::vector<std::vector<int64_t>>>(),
                           form[6].cast<std::vector<std::vector<int64_t>>>(), form[7].cast<std::vector<Tensor>>(),
                           form[8].cast<std::vector<bool>>(), form[9].cast<int64_t>(), form[10].cast<std::vector<int64_t>>());
    TORCH_CHECK(l->n_operands == 7 && l->outputs.size() == 3, "a backward takes q, k, v, out, dout, lse, dlse and gives dq, dk, dv");
    auto r = interval_runner(std::move(l), data, n_inputs, std::nullopt);
    r->grad_strides = std::move(grad_strides);
    r->guard_lse = guard;
    remember(g_bwd, bwd_key(dout, q, k, v, out, lse, bias, extra, spec, need_dbias), std::move(r));
    return true;
}

// TVM-FFI's C functions, resolved by Python from the libtvm_ffi it loaded (addresses).
void set_tvm_ffi(int64_t call, int64_t set_stream, int64_t error_move, int64_t inc_ref, int64_t dec_ref) {
    te_interval::Ffi f;
    f.inc_ref = reinterpret_cast<decltype(f.inc_ref)>(static_cast<uintptr_t>(inc_ref));
    f.call = reinterpret_cast<decltype(f.call)>(static_cast<uintptr_t>(call));
    f.set_stream = reinterpret_cast<decltype(f.set_stream)>(static_cast<uintptr_t>(set_stream));
    f.error_move = reinterpret_cast<decltype(f.error_move)>(static_cast<uintptr_t>(error_move));
    f.dec_ref = reinterpret_cast<decltype(f.dec_ref)>(static_cast<uintptr_t>(dec_ref));
    te_interval::ffi() = f;
}

void block_checked(Tensor const &q, Tensor const &k, std::vector<Tensor> const &extra, std::string const &spec) {
    Key key = block_key(spec, q, k, extra);
    std::unique_lock<std::shared_mutex> lock(g_mutex);
    if (g_blocks.size() >= kMaxBlocks) g_blocks.clear();
    g_blocks.insert(std::move(key));
}

void clear() {
    std::unordered_map<Key, std::shared_ptr<Runner>, KeyHash> fwd, bwd;  // destroyed after the lock is released
    std::unique_lock<std::shared_mutex> lock(g_mutex);
    fwd.swap(g_fwd);
    bwd.swap(g_bwd);
    g_blocks.clear();
}

// Drop the runners of one cuDNN graph (it left Python's graph cache); their plans go with them.
void forget(int64_t owner) {
    std::vector<std::shared_ptr<Runner>> gone;  // destroyed after the lock is released
    std::unique_lock<std::shared_mutex> lock(g_mutex);
    for (auto *table : {&g_fwd, &g_bwd})
        for (auto it = table->begin(); it != table->end();) {
            if (owner != 0 && it->second->owner == owner) {
                gone.push_back(std::move(it->second));
                it = table->erase(it);
            } else {
                ++it;
            }
        }
}

py::dict stats() {
    std::shared_lock<std::shared_mutex> lock(g_mutex);
    py::dict d;
    d["hits"] = g_hits.load();
    d["misses"] = g_misses.load();
    d["forward_runners"] = g_fwd.size();
    d["backward_runners"] = g_bwd.size();
    d["blockmasks"] = g_blocks.size();
    d["replays"] = g_replays.load();
    d["captures"] = g_captures.load();
    d["replay"] = g_replay.load() && cuda.ok();
    d["interval_launch_failed"] = g_interval_off.load();
    d["failed_runners"] = g_failed.load();
    d["plans"] = g_plans.load();
    return d;
}

// Makes the next ``n`` plan executes fail (a test hook: the failure surfaces once and the call still returns).
void fail_next(int n) { g_fail_next.store(n); }

// Replays on or off (on by default where the CUDA runtime's graph API was found); returns the old setting.
bool set_replay(bool on) { return g_replay.exchange(on); }

py::dict uids() {
    py::dict d;
    d["Q"] = int64_t(UID_Q); d["K"] = int64_t(UID_K); d["V"] = int64_t(UID_V); d["BIAS"] = int64_t(UID_BIAS);
    d["O"] = int64_t(UID_O); d["STATS"] = int64_t(UID_STATS); d["DO"] = int64_t(UID_DO); d["DQ"] = int64_t(UID_DQ);
    d["DK"] = int64_t(UID_DK); d["DV"] = int64_t(UID_DV); d["DBIAS"] = int64_t(UID_DBIAS);
    d["INPUTS"] = int64_t(UID_INPUTS); d["CONSTS"] = int64_t(UID_CONSTS);
    return d;
}

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
