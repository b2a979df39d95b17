// Part of native_attn.cpp (one translation unit): one execute of a runner's plan, and its replays as CUDA graphs; failures warned once.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

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

// cuDNN's status as text, with its number.
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
