// Part of native_attn.cpp (one translation unit): the signature of a call: the key a runner is found by.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

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
