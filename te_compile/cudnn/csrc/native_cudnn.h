// Part of native_attn.cpp (one translation unit): cuDNN's C API and the CUDA runtime, bound from the libraries this process loaded; plans destroyed with their runner.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

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

// Whether work on ``stream`` is being captured into a CUDA graph (unknown counts as captured).
bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cuda.is_capturing(stream, &st) != cudaSuccess) {
        cuda.last_error();
        return true;  // unknown: treat as capturing (execute, as under CUDA graphs)
    }
    return st != cudaStreamCaptureStatusNone;
}

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
