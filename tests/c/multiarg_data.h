/* What tests/c/multiarg_model.py writes for the C API's multiarg tests:
 * the data of its 16 rows and Python's predictions after training. */
#ifndef FULGOR_TESTS_C_MULTIARG_DATA_H
#define FULGOR_TESTS_C_MULTIARG_DATA_H

#include "check.h"

enum { kRows = 16, kSteps = 20 };

typedef struct multiarg_data {
  float x[kRows][3], t[kRows][2], u[kRows][2], v[kRows][1];
  float want_u[kRows][2], want_v[kRows][1]; /* Python's predictions */
  double want_losses[kSteps];               /* Python's loss at each step */
} multiarg_data;

static inline void read_multiarg_data(const char* folder, multiarg_data* d) {
  read_file(folder, "x.bin", d->x, sizeof d->x);
  read_file(folder, "t.bin", d->t, sizeof d->t);
  read_file(folder, "u.bin", d->u, sizeof d->u);
  read_file(folder, "v.bin", d->v, sizeof d->v);
  read_file(folder, "pred_u.bin", d->want_u, sizeof d->want_u);
  read_file(folder, "pred_v.bin", d->want_v, sizeof d->want_v);
  read_file(folder, "losses.bin", d->want_losses, sizeof d->want_losses);
}

#endif
