// Part of native_attn.cpp (one translation unit): the ops' CUDA kernels (graph plans and cuDNN's interval kernels) and Autograd kernels.
// Included inside native_attn.cpp's anonymous namespace, after the parts before it; not a header of its own.

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
    if (!r || r->failed || (!r->block.empty() && !block_known(spec, q, k, extra, r->block)))
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
