/* The C API from C: a TorchScript regression network trained, used, saved
 * and loaded; each kind of bad input answered with its status and message.
 *
 *   fulgor_c_api_test MODEL.pt NOT_A_MODEL OUTDIR
 *
 * MODEL.pt is tests/jit/torchscript_model.py's network (4 inputs, 1 output).
 * Each status of include/fulgor/c/fulgor.h's table is checked for each of
 * its causes. Exits 0 when every check holds; otherwise prints the failed
 * checks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fulgor/c/fulgor.h"

enum { kRows = 32, kFeatures = 4 };

/* Each of the configuration's causes answered with its status, the message
 * naming the key. */
static void check_configuration_errors(const char* path) {
  fulgor_model* model = NULL;
  CHECK_ERROR(fulgor_model_create(path, "{\"optimizer\": {\"lr\": -1}}", &model), FULGOR_ERROR_CONFIG,
              "key 'lr' is -1; expected a number >= 0");
  CHECK_ERROR(fulgor_model_create(path, "{\"optimizer\": {\"type\": \"sgd\", \"momentum\": -0.5}}", &model),
              FULGOR_ERROR_CONFIG, "key 'momentum' is -0.5");
  CHECK_ERROR(fulgor_model_create(path, "{\"optimizer\": {\"betas\": [0.9, 1.5]}}", &model), FULGOR_ERROR_CONFIG,
              "expected two numbers in [0, 1)");
  CHECK_ERROR(fulgor_model_create(path, "{\"optimizer\": {\"type\": \"sgdd\"}}", &model), FULGOR_ERROR_CONFIG,
              "did you mean 'sgd'?");
  CHECK_ERROR(fulgor_model_create(path, "{\"lr_scheduler\": {\"type\": \"step\", \"step_size\": 0}}", &model),
              FULGOR_ERROR_CONFIG, "\"lr_scheduler\": StepLR: step_size must be positive");
  CHECK_ERROR(fulgor_model_create(path, "{\"loss\": \"mse\", \"loss\": \"l1\"}", &model), FULGOR_ERROR_CONFIG,
              "the key \"loss\" appears twice");
  CHECK_ERROR(fulgor_model_create(path, "{\"seed\": 18446744073709551616}", &model), FULGOR_ERROR_CONFIG,
              "out of range");
  CHECK_ERROR(fulgor_model_create(path, "{\"strategy\": \"deepspeed\"}", &model), FULGOR_ERROR_CONFIG, "deepspeed");
  CHECK_ERROR(fulgor_model_create(path, "{\"strategy\": \"fsdp\"}", &model), FULGOR_ERROR_CONFIG, "FULL_SHARD");
  CHECK_ERROR(fulgor_model_create(path, "{\"strategy\": \"fsdp\", \"sharding_strategy\": \"hybrid_shard\"}", &model),
              FULGOR_ERROR_CONFIG, "HYBRID_SHARD shards the parameters of fulgor::Sharded units");
  CHECK_ERROR(fulgor_model_create(path, "{\"zero_redundancy_optimizer\": \"yes\"}", &model), FULGOR_ERROR_CONFIG,
              "key 'zero_redundancy_optimizer' is \"yes\" (string); expected true or false");
  CHECK_ERROR(fulgor_model_create(path, "{\"ddp_timeout\": 0}", &model), FULGOR_ERROR_CONFIG,
              "key 'ddp_timeout' is 0; expected a finite number of seconds > 0");
  CHECK_ERROR(fulgor_model_create(path, "{\"accelerator\": \"xpuu\"}", &model), FULGOR_ERROR_CONFIG,
              "unknown accelerator 'xpuu'; did you mean 'xpu'?");
  /* No machine that runs the tests has the xpu runtime; "gpu" is unavailable
   * where no CUDA device is. */
  CHECK_ERROR(fulgor_model_create(path, "{\"accelerator\": \"xpu\"}", &model), FULGOR_ERROR_DEVICE, "xpu");
  fulgor_status gpu = fulgor_model_create(path, "{\"accelerator\": \"gpu\"}", &model);
  CHECK(gpu == FULGOR_OK || gpu == FULGOR_ERROR_DEVICE);
  if (gpu == FULGOR_OK) {
    printf("\"accelerator\": \"gpu\" found a GPU\n");
    fulgor_model_destroy(model);
    model = NULL;
  }
  CHECK(model == NULL);
}

/* What a file is, said when it is not what the call takes. */
static void check_file_errors(const char* path, const char* checkpoint, fulgor_model* model, const char* dir) {
  char missing[4096];
  snprintf(missing, sizeof missing, "%s/no_such_file.pt", dir);
  fulgor_model* other = NULL;
  CHECK_ERROR(fulgor_model_create(missing, "{}", &other), FULGOR_ERROR_MODEL, "No such file or directory");
  CHECK_ERROR(fulgor_model_create(checkpoint, "{}", &other), FULGOR_ERROR_MODEL,
              "is a fulgor checkpoint (tensors and JSON, as fulgor_save writes), not a TorchScript file");
  CHECK_ERROR(fulgor_model_create(dir, "{}", &other), FULGOR_ERROR_MODEL, "is a folder");
  CHECK_ERROR(fulgor_load(model, path), FULGOR_ERROR_CHECKPOINT, "is a TorchScript file (torch.jit.save of a model");
  CHECK_ERROR(fulgor_load(model, missing), FULGOR_ERROR_CHECKPOINT, "No such file or directory");
  /* A checkpoint of a model without a schedule, loaded into one with a
   * schedule: the advice names no option the C API lacks. */
  char plain[4096];
  snprintf(plain, sizeof plain, "%s/plain.ckpt", dir);
  CHECK(fulgor_model_create(path, "{\"accelerator\": \"cpu\"}", &other) == FULGOR_OK);
  CHECK(fulgor_save(other, plain) == FULGOR_OK);
  fulgor_model_destroy(other);
  other = NULL;
  CHECK(fulgor_model_create(path, "{\"accelerator\": \"cpu\", \"lr_scheduler\": {\"type\": \"cosine\", \"T_max\": 5}}",
                            &other) == FULGOR_OK);
  if (other == NULL) return;
  CHECK_ERROR(fulgor_load(other, plain), FULGOR_ERROR_CHECKPOINT, "has no 'lr_scheduler'");
  CHECK(strstr(fulgor_last_error(), "strict") == NULL);
  CHECK(strstr(fulgor_last_error(), "a model configured alike") != NULL);
  fulgor_model_destroy(other);
}

/* Handles: a destroyed one and a pointer to something else are refused. */
static void check_handles(const char* path, const char* config, const float* x, const float* y) {
  const int64_t x_shape[2] = {kRows, kFeatures}, y_shape[2] = {kRows, 1};
  double loss = 0;
  fulgor_model* model = NULL;
  CHECK(fulgor_model_create(path, config, &model) == FULGOR_OK);
  fulgor_model_destroy(model);
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, x_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_ARGUMENT, "not a live model");
  int64_t rank = 0, world_size = 0;
  CHECK_ERROR(fulgor_model_rank(model, &rank, &world_size), FULGOR_ERROR_ARGUMENT, "not a live model");
  double not_a_model[32] = {0};
  fulgor_model* foreign = (fulgor_model*)not_a_model;
  CHECK_ERROR(fulgor_save(foreign, "never.ckpt"), FULGOR_ERROR_ARGUMENT, "was not made by fulgor_model_create");
  fulgor_model_destroy(foreign); /* refused, not freed */
  CHECK(strstr(fulgor_last_error(), "fulgor_model_destroy: the model is not a live model") != NULL);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fulgor_c_api_test MODEL.pt NOT_A_MODEL OUTDIR\n");
    return 2;
  }
  const char* path = argv[1];
  char checkpoint[4096];
  snprintf(checkpoint, sizeof checkpoint, "%s/c_api.ckpt", argv[3]);

  /* The data: y = x0 - 2 x1 + 0.5 x2, deterministic. */
  float x[kRows][kFeatures], y[kRows][1];
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kFeatures; ++j) x[i][j] = (float)sin(0.7 * i + 1.3 * j);
    y[i][0] = x[i][0] - 2 * x[i][1] + 0.5f * x[i][2];
  }
  const int64_t x_shape[2] = {kRows, kFeatures}, y_shape[2] = {kRows, 1};

  /* Bad configurations and files. */
  fulgor_model* model = NULL;
  CHECK_ERROR(fulgor_model_create(path, "{not json", &model), FULGOR_ERROR_CONFIG, "not JSON");
  CHECK(model == NULL);
  CHECK_ERROR(fulgor_model_create(path, "{\"optimiser\": {}}", &model), FULGOR_ERROR_CONFIG, "unknown key 'optimiser'");
  CHECK_ERROR(fulgor_model_create(path, "{\"loss\": 3}", &model), FULGOR_ERROR_CONFIG, "expected a string");
  CHECK_ERROR(fulgor_model_create(path, "{\"loss\": \"hinge\"}", &model), FULGOR_ERROR_CONFIG, "unknown loss");
  CHECK_ERROR(fulgor_model_create(path, "{\"optimizer\": {\"type\": \"sgd\", \"lr\": \"fast\"}}", &model),
              FULGOR_ERROR_CONFIG, "expected a number");
  CHECK_ERROR(fulgor_model_create(path, "{\"precision\": \"8-true\"}", &model), FULGOR_ERROR_CONFIG, "8-true");
  CHECK_ERROR(fulgor_model_create(argv[2], "{}", &model), FULGOR_ERROR_MODEL, "is not a TorchScript file");
  CHECK_ERROR(fulgor_model_create(NULL, "{}", &model), FULGOR_ERROR_ARGUMENT, "null");
  check_configuration_errors(path);

  const char* config =
      "{\"accelerator\": \"cpu\", \"loss\": \"mse\", \"seed\": 1,"
      " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9},"
      " \"lr_scheduler\": {\"type\": \"step\", \"step_size\": 100, \"gamma\": 0.5}}";
  CHECK(fulgor_model_create(path, config, &model) == FULGOR_OK);
  if (model == NULL) return 1;
  int64_t rank = -1, world_size = -1;
  CHECK(fulgor_model_rank(model, &rank, &world_size) == FULGOR_OK);
  CHECK(rank == 0 && world_size == 1);

  /* Training lowers the loss. */
  double first = 0, loss = 0;
  for (int step = 0; step < 200; ++step) {
    CHECK(fulgor_train(model, x, FULGOR_FLOAT32, x_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss) == FULGOR_OK);
    if (step == 0) first = loss;
  }
  printf("loss %g -> %g\n", first, loss);
  CHECK(isfinite(loss) && loss < first / 4);

  /* Buffers that do not fit, answered without a crash. */
  const int64_t narrow_shape[2] = {kRows, 3}, short_label[2] = {kRows - 1, 1}, negative[2] = {kRows, -1};
  int64_t labels[kRows];
  memset(labels, 0, sizeof labels);
  const int64_t label_rows[1] = {kRows};
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, narrow_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_MODEL, "forward failed on the given inputs");
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, x_shape, 2, y, FULGOR_FLOAT32, short_label, 2, &loss),
              FULGOR_ERROR_SHAPE, "does not fit loss 'mse'");
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, x_shape, 2, labels, FULGOR_INT64, label_rows, 1, &loss),
              FULGOR_ERROR_SHAPE, "does not fit loss 'mse'");
  CHECK_ERROR(fulgor_train(model, NULL, FULGOR_FLOAT32, x_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_ARGUMENT, "input is a null pointer");
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, negative, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_ARGUMENT, "negative size");
  CHECK_ERROR(fulgor_train(model, x, (fulgor_dtype)42, x_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_ARGUMENT, "dtype 42 is unknown");
  CHECK_ERROR(fulgor_train(NULL, x, FULGOR_FLOAT32, x_shape, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss),
              FULGOR_ERROR_ARGUMENT, "null pointer");
  const int64_t huge[2] = {INT64_MAX / 2, kFeatures}, empty_x[2] = {0, kFeatures}, empty_y[2] = {0, 1};
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, huge, 2, y, FULGOR_FLOAT32, y_shape, 2, &loss), FULGOR_ERROR_SHAPE,
              "holds more bytes than 2^63");
  loss = -1;
  CHECK_ERROR(fulgor_train(model, x, FULGOR_FLOAT32, empty_x, 2, y, FULGOR_FLOAT32, empty_y, 2, &loss),
              FULGOR_ERROR_SHAPE, "an empty batch");
  CHECK(loss == -1);

  /* Predictions, and the same ones after a save and a load into another model. */
  float predicted[kRows][1], reloaded[kRows][1], wide[kRows][2];
  const int64_t wide_shape[2] = {kRows, 2};
  CHECK(fulgor_predict(model, x, FULGOR_FLOAT32, x_shape, 2, predicted, FULGOR_FLOAT32, y_shape, 2) == FULGOR_OK);
  double error = 0;
  for (int i = 0; i < kRows; ++i) error += (predicted[i][0] - y[i][0]) * (predicted[i][0] - y[i][0]);
  CHECK(error / kRows < first / 4);
  CHECK_ERROR(fulgor_predict(model, x, FULGOR_FLOAT32, x_shape, 2, wide, FULGOR_FLOAT32, wide_shape, 2),
              FULGOR_ERROR_SHAPE, "do not fit the model's output(s)");
  CHECK(fulgor_save(model, checkpoint) == FULGOR_OK);
  fulgor_model* other = NULL;
  CHECK(fulgor_model_create(path, config, &other) == FULGOR_OK);
  CHECK(fulgor_load(other, checkpoint) == FULGOR_OK);
  CHECK(fulgor_predict(other, x, FULGOR_FLOAT32, x_shape, 2, reloaded, FULGOR_FLOAT32, y_shape, 2) == FULGOR_OK);
  CHECK(memcmp(predicted, reloaded, sizeof predicted) == 0);
  CHECK_ERROR(fulgor_load(other, argv[2]), FULGOR_ERROR_CHECKPOINT, argv[2]);
  check_file_errors(path, checkpoint, other, argv[3]);
  check_handles(path, config, &x[0][0], &y[0][0]);

  fulgor_model_destroy(other);
  fulgor_model_destroy(model);
  fulgor_model_destroy(NULL);
  if (failures == 0) printf("all checks passed\n");
  return failures == 0 ? 0 : 1;
}
