// Part of native_attn.cpp (one translation unit): a runner: a loaded plan, its variant pack's slots, what its calls need besides.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

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
    // the call carries a BlockMask, which must be one Python checked: which of the call's extra tensors decide the
    // check (the BlockMask's and the inputs its mask_mod reads; te_compile.runtime.blockmask.key_indices); empty: none
    std::vector<int64_t> block;
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

bool block_known(c10::string_view spec, Tensor const &q, Tensor const &k, at::TensorList extra,
                 std::vector<int64_t> const &which) {
    std::vector<Tensor> decide;
    decide.reserve(which.size());
    for (int64_t i : which) {
        if (i < 0 || i >= static_cast<int64_t>(extra.size())) return false;
        decide.push_back(extra[i]);
    }
    Key key = block_key(spec, q, k, decide);
    std::shared_lock<std::shared_mutex> lock(g_mutex);
    return g_blocks.count(key) > 0;
}
