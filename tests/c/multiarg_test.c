/* The C API's multiarg calls from C, against python3-torch: a TorchScript
 * model of two inputs and two outputs trained with a TorchScript loss of
 * both outputs and two labels, configured from a file, gives Python's loss
 * at every step and Python's predictions, bit for bit; and each misuse of
 * the multiarg calls and of the configuration file is answered with its
 * status.
 *
 *   fulgor_c_multiarg_test DIR
 *
 * DIR holds what tests/c/multiarg_model.py wrote. Run from another folder:
 * the configuration names loss.pt relative to its own folder. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "fulgor/c/fulgor.h"
#include "multiarg_data.h"

static const char* folder;

static const char* in_folder(char* out, const char* name) {
  snprintf(out, 4096, "%s/%s", folder, name);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fulgor_c_multiarg_test DIR\n");
    return 2;
  }
  folder = argv[1];
  static multiarg_data d;
  read_multiarg_data(folder, &d);
  const int64_t x_shape[2] = {kRows, 3}, t_shape[2] = {kRows, 2}, u_shape[2] = {kRows, 2}, v_shape[2] = {kRows, 1};
  const fulgor_tensor inputs[2] = {{d.x, FULGOR_FLOAT32, x_shape, 2}, {d.t, FULGOR_FLOAT32, t_shape, 2}};
  const fulgor_tensor labels[2] = {{d.u, FULGOR_FLOAT32, u_shape, 2}, {d.v, FULGOR_FLOAT32, v_shape, 2}};

  char model_path[4096], config_path[4096];
  in_folder(model_path, "model.pt");
  in_folder(config_path, "config.json");
  fulgor_model* model = NULL;
  CHECK(fulgor_model_create_from_file(model_path, config_path, &model) == FULGOR_OK);
  if (model == NULL) return 1;
  int same = 1;
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    CHECK(fulgor_train_multiarg(model, inputs, 2, labels, 2, &loss) == FULGOR_OK);
    if (memcmp(&loss, &d.want_losses[step], sizeof loss) != 0) {
      fprintf(stderr, "step %d: loss %.17g, Python's %.17g\n", step, loss, d.want_losses[step]);
      same = 0;
    }
  }
  CHECK(same);
  CHECK(d.want_losses[kSteps - 1] < d.want_losses[0] / 2);
  float got_u[kRows][2], got_v[kRows][1];
  const fulgor_tensor outputs[2] = {{got_u, FULGOR_FLOAT32, u_shape, 2}, {got_v, FULGOR_FLOAT32, v_shape, 2}};
  CHECK(fulgor_predict_multiarg(model, inputs, 2, outputs, 2) == FULGOR_OK);
  CHECK(memcmp(got_u, d.want_u, sizeof got_u) == 0);
  CHECK(memcmp(got_v, d.want_v, sizeof got_v) == 0);

  /* Misuse of the multiarg calls. */
  double loss = -1;
  CHECK_ERROR(fulgor_train_multiarg(model, inputs, 0, labels, 2, &loss), FULGOR_ERROR_ARGUMENT,
              "0 inputs buffers: expected 1 to 64");
  CHECK_ERROR(fulgor_train_multiarg(model, NULL, 2, labels, 2, &loss), FULGOR_ERROR_ARGUMENT,
              "inputs is a null pointer");
  const fulgor_tensor no_data[2] = {{d.x, FULGOR_FLOAT32, x_shape, 2}, {NULL, FULGOR_FLOAT32, t_shape, 2}};
  CHECK_ERROR(fulgor_train_multiarg(model, no_data, 2, labels, 2, &loss), FULGOR_ERROR_ARGUMENT,
              "inputs[1] is a null pointer");
  CHECK_ERROR(fulgor_train_multiarg(model, inputs, 1, labels, 2, &loss), FULGOR_ERROR_MODEL,
              "forward failed on the given inputs");
  CHECK_ERROR(fulgor_train_multiarg(model, inputs, 2, labels, 1, &loss), FULGOR_ERROR_MODEL,
              "the TorchScript loss failed on 2 output(s) and 1 label(s)");
  CHECK(loss == -1);
  CHECK_ERROR(fulgor_predict_multiarg(model, inputs, 2, outputs, 1), FULGOR_ERROR_SHAPE,
              "output buffer(s) [16, 2] Float do not fit the model's output(s) [16, 2] Float, [16, 1] Float");
  fulgor_model_destroy(model);

  /* A built-in loss takes one output and one label. */
  CHECK(fulgor_model_create(model_path, "{\"accelerator\": \"cpu\"}", &model) == FULGOR_OK);
  CHECK_ERROR(fulgor_train_multiarg(model, inputs, 2, labels, 2, &loss), FULGOR_ERROR_SHAPE,
              "loss 'mse' takes one output and one label; the model gave 2 output(s) for 2 label(s)");
  fulgor_model_destroy(model);
  model = NULL;

  /* The configuration file and the loss it names. */
  char missing[4096], fifo[4096];
  CHECK_ERROR(fulgor_model_create_from_file(model_path, in_folder(missing, "none.json"), &model), FULGOR_ERROR_CONFIG,
              "none.json' cannot be opened: No such file or directory");
  CHECK(mkfifo(in_folder(fifo, "fifo.json"), 0600) == 0);
  CHECK_ERROR(fulgor_model_create_from_file(model_path, fifo, &model), FULGOR_ERROR_CONFIG,
              "fifo.json' is a FIFO, not a regular file");
  CHECK_ERROR(fulgor_model_create_from_file(model_path, NULL, &model), FULGOR_ERROR_ARGUMENT,
              "config_path is a null pointer");
  CHECK_ERROR(fulgor_model_create(model_path, "{\"loss\": {\"type\": \"torchscript\", \"path\": \"loss.pt\"}}", &model),
              FULGOR_ERROR_MODEL, "the loss 'loss.pt': it cannot be opened: No such file or directory");
  CHECK_ERROR(fulgor_model_create(model_path, "{\"loss\": {\"type\": \"python\", \"path\": \"loss.py\"}}", &model),
              FULGOR_ERROR_CONFIG, "unknown type 'python'");
  CHECK_ERROR(fulgor_model_create(model_path, "{\"loss\": {\"type\": \"torchscript\"}}", &model), FULGOR_ERROR_CONFIG,
              "needs \"path\", its TorchScript file");
  char bad_loss[8192];
  snprintf(bad_loss, sizeof bad_loss, "{\"loss\": {\"type\": \"torchscript\", \"path\": \"%s\"}}", config_path);
  CHECK_ERROR(fulgor_model_create(model_path, bad_loss, &model), FULGOR_ERROR_MODEL, "not a TorchScript file");
  CHECK(model == NULL);
  if (failures == 0) printf("all checks passed\n");
  return failures == 0 ? 0 : 1;
}
