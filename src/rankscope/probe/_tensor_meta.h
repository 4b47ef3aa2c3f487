/* The contract between the probe's C wrapper (_fast.c) and its optional tensor reader
 * (_meta.cpp): a tensor's sizes and scalar type, read from the tensor itself instead of through
 * torch's .shape and .dtype getters. */
#ifndef RANKSCOPE_TENSOR_META_H
#define RANKSCOPE_TENSOR_META_H

#include <Python.h>

/* Tensors of more dimensions are read through torch's getters. */
#define TENSOR_META_DIMS 8

typedef struct {
    int ndim;
    int scalar_type; /* c10::ScalarType */
    int on_cpu;      /* its device is the CPU: a wait on a collective of it returns once done */
    long long sizes[TENSOR_META_DIMS];
} TensorMeta;

/* Fills *out from a torch.Tensor (the exact type, GIL held): 0, or -1 when this tensor's sizes
 * are not plain fields (nested, symbolic, a Python subclass's); no exception is ever set. */
typedef int (*tensor_meta_fn)(PyObject *tensor, TensorMeta *out);

/* named anew whenever TensorMeta changes: a reader built for another layout is not used */
#define TENSOR_META_CAPSULE "rankscope.probe._meta.read.2"

#endif
