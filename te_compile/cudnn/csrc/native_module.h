// Part of native_attn.cpp (one translation unit): what Python calls: binding cuDNN, installing the kernels, registering and dropping runners, stats.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

// --------------------------------------------------------------------------- Python interface

// A library this process has loaded, possibly with RTLD_LOCAL (torch's libcudart, a preloaded libcudnn): its name
// found among the loaded objects, then opened again (RTLD_NOLOAD: only if loaded). nullptr when none is.
void *loaded_library(char const *part) {
    std::vector<std::string> names;
    std::pair<char const *, std::vector<std::string> *> wanted(part, &names);
    dl_iterate_phdr(
        [](struct dl_phdr_info *info, size_t, void *data) -> int {
            auto *out = static_cast<std::pair<char const *, std::vector<std::string> *> *>(data);
            if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, out->first) != nullptr)
                out->second->emplace_back(info->dlpi_name);
            return 0;
        },
        &wanted);
    for (auto const &name : names)  // opened after the walk: dlopen is not called under the loader's lock
        if (void *h = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) return h;
    return nullptr;
}

void *cuda_symbol(char const *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (p != nullptr) return p;
    static void *lib = loaded_library("libcudart.so");
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

std::string init() {
    if (api.lib != nullptr) return "";
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = loaded_library("/libcudnn.so.9");
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
                      bool bias_rows, std::vector<int64_t> block) {
    auto r = load_runner(plan_json, q.device().index(), uids, kinds, payloads, offsets, fe_workspace, n_inputs, consts);
    r->owner = owner;
    r->out_shape = std::move(out_shape);
    r->out_stride = std::move(out_stride);
    r->lse_shape = {r->out_shape[0], r->out_shape[1], r->out_shape[2]};
    r->bias_shape = std::move(bias_shape);
    r->bias_copy = bias_copy;
    if (rows) r->rows = *rows;
    r->bias_rows = bias_rows;
    r->block = std::move(block);
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
                               int64_t n_inputs, std::vector<int64_t> block) {
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
    r->block = std::move(block);
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
