// A tensor's sizes and scalar type for the probe's C wrapper, read from its TensorImpl.
//
// torch's .shape getter checks for torch-function modes, asks for symbolic sizes and makes a
// torch.Size; right after a collective returns, with the rank's caches cold, that and .dtype
// cost about a microsecond a call. Here the same facts are two fields of the TensorImpl, and
// the wrapper compares them with what its call site saw last.
//
// The layouts of THPVariable and TensorImpl are torch's own and change between releases, so
// this is built against the torch installed at build time (setup.py), records which one, and
// the probe uses it only under that same torch (_core.py); otherwise the getters are used.
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

extern "C" {
#include "_tensor_meta.h"
}

#ifndef RANKSCOPE_TORCH_BUILD
#error "setup.py defines RANKSCOPE_TORCH_BUILD: the torch this is built against"
#endif

static int
read_meta(PyObject *tensor, TensorMeta *out) noexcept
{
    try {
        const c10::TensorImpl *impl = THPVariable_Unpack(tensor).unsafeGetTensorImpl();
        // Sizes that torch works out on request are left to its getters: a Python subclass's
        // (which may call back into Python), symbolic ones, nested tensors'.
        if (impl->key_set().has(c10::DispatchKey::Python) || impl->has_symbolic_sizes_strides() ||
            impl->is_nested())
            return -1;
        const caffe2::TypeMeta dtype = impl->dtype();
        const c10::IntArrayRef sizes = impl->sizes();
        if (!dtype.isScalarType() || sizes.size() > TENSOR_META_DIMS)
            return -1;
        out->ndim = static_cast<int>(sizes.size());
        out->scalar_type = static_cast<int>(dtype.toScalarType());
        out->on_cpu = impl->device_type() == c10::DeviceType::CPU;
        for (size_t i = 0; i < sizes.size(); i++)
            out->sizes[i] = sizes[i];
        return 0;
    }
    catch (...) {
        return -1;
    }
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "rankscope.probe._meta",
    "A tensor's sizes and dtype read for the probe's C wrapper (optional; see _meta.cpp).",
    -1,
};

PyMODINIT_FUNC
PyInit__meta(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *read = PyCapsule_New(reinterpret_cast<void *>(read_meta), TENSOR_META_CAPSULE, NULL);
    if (read == NULL || PyModule_AddObjectRef(m, "read", read) < 0 ||
        PyModule_AddStringConstant(m, "torch_build", RANKSCOPE_TORCH_BUILD) < 0 ||
        PyModule_AddStringConstant(m, "layout", TENSOR_META_CAPSULE) < 0) {
        Py_XDECREF(read);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(read);
    return m;
}
