/* The C API under a launcher: each rank trains tests/c/multiarg_model.py's
 * model on its share of the 16 rows, with the configuration CONFIG (ddp,
 * or sharded), saves a checkpoint after 10 of the 20 steps and goes on; a
 * second model loads that checkpoint and trains the last 10 steps too.
 *
 *   fulgor_c_data_parallel_test DIR CONFIG OUT
 *
 * Checks that the gradients were averaged over the ranks (the predictions
 * are Python's single-process ones, up to float32 rounding) and that the
 * resumed model ends as the uninterrupted one (up to the rounding of Note
 * [A TorchScript model resumed], docs/ways_in.md); writes this rank's
 * predictions to OUT.rankR, which the caller compares across the ranks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fulgor/c/fulgor.h"
#include "multiarg_data.h"

static const char* folder;

/* Rows [begin, end) of a row-major float buffer of `columns` columns, as a fulgor_tensor. */
static fulgor_tensor rows_of(float* data, int64_t columns, int64_t begin, int64_t end, int64_t shape[2]) {
  shape[0] = end - begin;
  shape[1] = columns;
  fulgor_tensor t = {data + begin * columns, FULGOR_FLOAT32, shape, 2};
  return t;
}

/* The largest difference between two models' predictions of u and v. */
static double largest_difference(float a_u[kRows][2], float a_v[kRows][1], float b_u[kRows][2], float b_v[kRows][1]) {
  double largest = 0;
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < 2; ++j) largest = fmax(largest, fabs((double)a_u[i][j] - b_u[i][j]));
    largest = fmax(largest, fabs((double)a_v[i][0] - b_v[i][0]));
  }
  return largest;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fulgor_c_data_parallel_test DIR CONFIG OUT\n");
    return 2;
  }
  folder = argv[1];
  static multiarg_data d;
  read_multiarg_data(folder, &d);
  char model_path[4096], config_path[4096], checkpoint[4096];
  snprintf(model_path, sizeof model_path, "%s/model.pt", folder);
  snprintf(config_path, sizeof config_path, "%s/%s", folder, argv[2]);
  snprintf(checkpoint, sizeof checkpoint, "%s.ckpt", argv[3]);

  fulgor_model* model = NULL;
  CHECK(fulgor_model_create_from_file(model_path, config_path, &model) == FULGOR_OK);
  if (model == NULL) return 1;
  int64_t rank = -1, world_size = -1;
  CHECK(fulgor_model_rank(model, &rank, &world_size) == FULGOR_OK);
  CHECK(world_size == 2);
  const int64_t begin = rank * kRows / world_size, end = (rank + 1) * kRows / world_size;
  int64_t shapes[4][2];
  const fulgor_tensor inputs[2] = {rows_of(&d.x[0][0], 3, begin, end, shapes[0]),
                                   rows_of(&d.t[0][0], 2, begin, end, shapes[1])};
  const fulgor_tensor labels[2] = {rows_of(&d.u[0][0], 2, begin, end, shapes[2]),
                                   rows_of(&d.v[0][0], 1, begin, end, shapes[3])};
  fulgor_model* resumed = NULL;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSteps / 2) {
      CHECK(fulgor_save(model, checkpoint) == FULGOR_OK);
      CHECK(fulgor_model_create_from_file(model_path, config_path, &resumed) == FULGOR_OK);
      if (resumed == NULL) return 1;
      CHECK(fulgor_load(resumed, checkpoint) == FULGOR_OK);
    }
    double loss = 0;
    CHECK(fulgor_train_multiarg(model, inputs, 2, labels, 2, &loss) == FULGOR_OK);
    if (resumed != NULL) CHECK(fulgor_train_multiarg(resumed, inputs, 2, labels, 2, &loss) == FULGOR_OK);
  }

  /* Predictions on every row. */
  static float got_u[kRows][2], got_v[kRows][1], again_u[kRows][2], again_v[kRows][1];
  int64_t all[6][2];
  const fulgor_tensor every_input[2] = {rows_of(&d.x[0][0], 3, 0, kRows, all[0]),
                                        rows_of(&d.t[0][0], 2, 0, kRows, all[1])};
  const fulgor_tensor outputs[2] = {rows_of(&got_u[0][0], 2, 0, kRows, all[2]),
                                    rows_of(&got_v[0][0], 1, 0, kRows, all[3])};
  const fulgor_tensor outputs_again[2] = {rows_of(&again_u[0][0], 2, 0, kRows, all[4]),
                                          rows_of(&again_v[0][0], 1, 0, kRows, all[5])};
  CHECK(fulgor_predict_multiarg(model, every_input, 2, outputs, 2) == FULGOR_OK);
  CHECK(fulgor_predict_multiarg(resumed, every_input, 2, outputs_again, 2) == FULGOR_OK);
  /* Note [A TorchScript model resumed]: the resumed model's first steps run
   * the executor's unoptimized graph, which rounds otherwise. */
  const double resumed_by = largest_difference(got_u, got_v, again_u, again_v);
  printf("rank %lld: the resumed model differs from the uninterrupted one by %.3g\n", (long long)rank, resumed_by);
  CHECK(resumed_by < 1e-5);
  /* Averaged gradients give the single process's steps up to float32
   * rounding; a sum, or one rank's gradient alone, moves them far more. */
  const double largest = largest_difference(got_u, got_v, d.want_u, d.want_v);
  printf("rank %lld: largest difference from Python's single process %.3g\n", (long long)rank, largest);
  CHECK(largest < 1e-4);

  char out[4096];
  snprintf(out, sizeof out, "%s.rank%lld", argv[3], (long long)rank);
  FILE* f = fopen(out, "wb");
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fwrite(got_u, 1, sizeof got_u, f) == sizeof got_u);
    CHECK(fwrite(got_v, 1, sizeof got_v, f) == sizeof got_v);
    fclose(f);
  }
  fulgor_model_destroy(resumed);
  fulgor_model_destroy(model);
  return failures == 0 ? 0 : 1;
}
