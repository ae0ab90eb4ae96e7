/* The library-wide entry points of linattn's compiled kernels (the op kernels live beside their
 * ops: ops/<op>/kernels.c). */
#ifndef LA_COMMON_H
#include "common.h"
#endif

/* What this build is, for the Python side: the vector width in floats and the register tile. */
int la_width(void) { return W; }
int la_tile(void) { return MR * 100 + NV; }
