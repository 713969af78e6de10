/* The compiled kernel, inwire._kernel (inwire.kernel loads it): one module made of the parts beside the
   modules they speed up, _codec.c (the member codec), _transport.c (batch socket I/O), _fastpath.c (the
   aggregator's decider) and _client.c (the member's result lane). */

#include "_kernel.h"

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", "The compiled kernel of inwire's hosts.", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__kernel(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, codec_methods) < 0 || PyModule_AddFunctions(m, transport_methods) < 0 ||
        PyModule_AddFunctions(m, lane_methods) < 0 || fastpath_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
