// Recorded launches of cuDNN's interval kernels (the frontend's ``cudnn.flex_attention``, CuTe DSL), called from C++.
//
// te_compile.cudnn.flexlaunch records, once per (mask plan, operand layout, scale), which compiled kernels the
// frontend launches and with which arguments: each argument is an operand of the call, a buffer allocated for the
// call (zeroed or not), a tensor of the plan, or a scalar. The compiled kernels are TVM-FFI functions; this file
// calls them through TVM-FFI's C ABI (``TVMFFIFunctionCall``, with PyTorch's current stream set as TVM-FFI's
// environment stream for the call, as TVM-FFI's Python binding does), so a call that hits a registered runner
// runs no Python. Python resolves the C functions from the libtvm_ffi it loaded (``set_tvm_ffi``); tensors are
// passed as DLTensor pointers, which the DSL's argument decoder accepts.
#pragma once

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <string>
#include <vector>

namespace te_interval {

// TVM-FFI's C ABI (tvm/ffi/c_api.h, extra/c_env_api.h): a 16-byte tagged value and the functions used here.
struct FfiAny {
    int32_t type_index;
    uint32_t zero_padding;
    union {
        int64_t v_int64;
        double v_float64;
        void *v_ptr;
    };
};
static_assert(sizeof(FfiAny) == 16, "TVMFFIAny is 16 bytes");

enum FfiType : int32_t {
    kNone = 0, kInt = 1, kBool = 2, kFloat = 3, kDLTensorPtr = 7, kStaticObjectBegin = 64, kArray = 71
};

struct Ffi {
    int (*call)(void *func, FfiAny *args, int32_t n, FfiAny *result) = nullptr;
    int (*set_stream)(int32_t device_type, int32_t device_id, void *stream, void **original) = nullptr;
    void (*error_move)(void **error) = nullptr;
    int (*inc_ref)(void *obj) = nullptr;
    int (*dec_ref)(void *obj) = nullptr;
    bool ok() const { return call && set_stream && error_move && inc_ref && dec_ref; }
};

inline Ffi &ffi() {
    static Ffi f;
    return f;
}

// One argument of a recorded launch.
struct Arg {
    enum Kind : int64_t { SLOT = 0, CONST = 1, INT = 2, FLOAT = 3, BOOL = 4, NONE = 5, ARRAY = 6 } kind;
    // SLOT: operand or buffer index; CONST: index into ``consts``; INT, BOOL: the value; ARRAY: the handle of a
    // TVM-FFI Array (a tuple of the plan's tensors, converted by Python)
    int64_t i = 0;
    double f = 0.0;  // FLOAT
};

struct Buffer {
    std::vector<int64_t> shape, stride;
    at::ScalarType dtype;
    bool zero;
};

// A call's launches: operands 0..n_operands-1 (undefined = None), then one buffer per ``buffers`` entry. Holds a
// reference to every TVM-FFI object it names (the functions, the Arrays), released with it.
struct Launches {
    std::vector<void *> funcs;           // TVM-FFI function handles
    std::vector<std::vector<Arg>> args;  // per launch
    std::vector<at::Tensor> consts;      // the plan's tensors
    std::vector<Buffer> buffers;
    int64_t n_operands = 0;
    std::vector<int64_t> outputs;  // slots returned
    std::vector<void *> held;      // TVM-FFI objects this holds a reference to
    void hold(void *obj) {
        ffi().inc_ref(obj);
        held.push_back(obj);
    }
    Launches() = default;
    Launches(Launches const &) = delete;
    Launches &operator=(Launches const &) = delete;
    ~Launches() {
        for (void *obj : held) ffi().dec_ref(obj);
    }
};

inline DLTensor dl_of(at::Tensor const &t) {
    DLTensor d{};
    d.data = t.data_ptr();
    d.device = DLDevice{kDLCUDA, static_cast<int32_t>(t.device().index())};
    d.ndim = static_cast<int32_t>(t.dim());
    d.dtype = at::getDLDataType(t);
    d.shape = const_cast<int64_t *>(t.sizes().data());
    d.strides = const_cast<int64_t *>(t.strides().data());
    d.byte_offset = 0;
    return d;
}

// Restores TVM-FFI's environment stream for the device when it leaves scope.
struct StreamScope {
    int32_t device;
    void *original = nullptr;
    bool set = false;
    StreamScope(int32_t dev, void *stream) : device(dev) {
        set = ffi().set_stream(kDLCUDA, device, stream, &original) == 0;
    }
    ~StreamScope() {
        if (set) ffi().set_stream(kDLCUDA, device, original, nullptr);
    }
};

// Runs the launches on PyTorch's current stream; returns the output slots. ``error`` gets a message and the
// result is empty when TVM-FFI reports a failure (the kernels' own argument checks included).
inline std::vector<at::Tensor> run(Launches const &l, std::vector<at::Tensor> operands, c10::Device device,
                                   std::string &error) {
    std::vector<at::Tensor> vals = std::move(operands);
    vals.reserve(vals.size() + l.buffers.size());
    for (auto const &b : l.buffers) {
        at::Tensor t = at::empty_strided(b.shape, b.stride, at::TensorOptions().dtype(b.dtype).device(device));
        if (b.zero) t.zero_();
        vals.push_back(std::move(t));
    }
    std::vector<DLTensor> dl(vals.size());
    for (size_t i = 0; i < vals.size(); i++)
        if (vals[i].defined()) dl[i] = dl_of(vals[i]);
    std::vector<DLTensor> cdl(l.consts.size());
    for (size_t i = 0; i < l.consts.size(); i++) cdl[i] = dl_of(l.consts[i]);
    auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    StreamScope scope(device.index(), stream.stream());
    if (!scope.set) {
        error = "TVMFFIEnvSetStream failed";
        return {};
    }
    std::vector<FfiAny> a;
    for (size_t c = 0; c < l.funcs.size(); c++) {
        a.assign(l.args[c].size(), FfiAny{});
        for (size_t j = 0; j < a.size(); j++) {
            Arg const &x = l.args[c][j];
            FfiAny &v = a[j];
            switch (x.kind) {
                case Arg::SLOT:
                    if (vals[x.i].defined()) {
                        v.type_index = kDLTensorPtr;
                        v.v_ptr = &dl[x.i];
                    }
                    break;  // an undefined operand is None
                case Arg::CONST: v.type_index = kDLTensorPtr; v.v_ptr = &cdl[x.i]; break;
                case Arg::INT: v.type_index = kInt; v.v_int64 = x.i; break;
                case Arg::BOOL: v.type_index = kBool; v.v_int64 = x.i; break;
                case Arg::FLOAT: v.type_index = kFloat; v.v_float64 = x.f; break;
                case Arg::ARRAY: v.type_index = kArray; v.v_ptr = reinterpret_cast<void *>(static_cast<uintptr_t>(x.i)); break;
                case Arg::NONE: break;
            }
        }
        FfiAny result{};
        int rc = ffi().call(l.funcs[c], a.data(), static_cast<int32_t>(a.size()), &result);
        if (result.type_index >= kStaticObjectBegin && result.v_ptr != nullptr) ffi().dec_ref(result.v_ptr);
        if (rc != 0) {
            void *err = nullptr;
            ffi().error_move(&err);
            if (err != nullptr) ffi().dec_ref(err);
            error = "launch " + std::to_string(c) + " of " + std::to_string(l.funcs.size()) +
                    " returned TVM-FFI status " + std::to_string(rc);
            return {};
        }
    }
    std::vector<at::Tensor> outs;
    for (int64_t i : l.outputs) outs.push_back(vals[i]);
    return outs;
}

}  // namespace te_interval
