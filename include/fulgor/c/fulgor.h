/* fulgor's C API: a model defined in Python (a TorchScript file) trained
 * from C, Fortran (through iso_c_binding) or any language that calls C,
 * inside the program's own loop, on fulgor's accelerators and precisions,
 * data-parallel when a launcher (torchrun, fulgor-run, srun) started the
 * program's processes.
 *
 * Contract:
 *   - Every function returns FULGOR_OK or an error code; after an error,
 *     fulgor_last_error() describes it (in the calling thread) until the
 *     thread's next call. No C++ exception leaves these functions.
 *   - A model is used from one thread at a time. Buffers are host memory in
 *     row-major (C) order, or memory on the model's device when the
 *     configuration says "buffers": "device".
 *   - A handle is checked at every call: a live model carries a magic number
 *     that fulgor_model_destroy clears, so a destroyed handle or a pointer to
 *     another object is FULGOR_ERROR_ARGUMENT. The check reads the memory the
 *     handle points to: it cannot catch a pointer into memory the program
 *     does not own, nor a destroyed handle whose memory a newer model has
 *     taken. Set a handle to NULL once destroyed.
 *   - Loading a TorchScript file runs the program it holds, by design (the
 *     user's own model); checkpoints written by fulgor_save hold tensors and
 *     JSON only.
 */
#ifndef FULGOR_C_FULGOR_H
#define FULGOR_C_FULGOR_H

#include <stdint.h>

/* Exported from libfulgor_c, which is built with hidden visibility. */
#if defined(__GNUC__) || defined(__clang__)
#define FULGOR_C_API __attribute__((visibility("default")))
#else
#define FULGOR_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Each status has its causes (tests/c/c_api_test.c checks each one). */
typedef enum fulgor_status {
  FULGOR_OK = 0,
  /* a null pointer, a negative rank or size, an unknown dtype, a number of buffers outside 1 to 64
   * (0 to 64 labels), a handle that is not a live model */
  FULGOR_ERROR_ARGUMENT = 1,
  /* the JSON configuration: a file that cannot be read or is no regular file, not JSON, a key
   * given twice, an unknown key or name (an accelerator, optimizer, schedule, loss), a value of
   * the wrong type or out of range */
  FULGOR_ERROR_CONFIG = 2,
  /* a model or loss file that is missing or not TorchScript (the message says what it is), a
   * forward that failed on the given inputs, a TorchScript loss that failed or gave more than one
   * number */
  FULGOR_ERROR_MODEL = 3,
  /* a buffer whose shape or dtype does not fit, several outputs or labels for a built-in loss,
   * output buffers other in number than the model's outputs, an empty batch to train on, sizes
   * whose bytes overflow */
  FULGOR_ERROR_SHAPE = 4,
  /* a checkpoint that cannot be written or read, that fulgor_save did not write (the
   * message says what it is), or that a model configured otherwise saved */
  FULGOR_ERROR_CHECKPOINT = 5,
  /* the accelerator is unavailable here ("gpu" without a GPU), failed, or ran out of memory */
  FULGOR_ERROR_DEVICE = 6,
  /* anything else: a fault of fulgor or LibTorch */
  FULGOR_ERROR_INTERNAL = 7
} fulgor_status;

typedef enum fulgor_dtype { FULGOR_FLOAT32 = 0, FULGOR_FLOAT64 = 1, FULGOR_INT32 = 2, FULGOR_INT64 = 3 } fulgor_dtype;

/* A model: the TorchScript module, its optimizer, schedule and loss, on its device. */
typedef struct fulgor_model fulgor_model;

/* One of several buffers a call takes or fills: its memory, dtype, shape and
 * rank, as the single-buffer calls take them one by one. */
typedef struct fulgor_tensor {
  void* data;
  fulgor_dtype dtype;
  const int64_t* shape;
  int32_t rank;
} fulgor_tensor;

/* What went wrong in this thread's last failed call ("" before any). */
FULGOR_C_API const char* fulgor_last_error(void);

/* Loads the TorchScript file at `torchscript_path` and configures its
 * training from `config_json`, a JSON object with the keys (all optional):
 *   "accelerator"   "auto" (default) or the name of a registered accelerator (fulgor-info lists them)
 *   "precision"     "32-true" (default), "bf16-mixed", "16-mixed", ...
 *   "loss"          "mse" (default), "l1", "smooth_l1", "huber", "cross_entropy", "nll", "bce_with_logits",
 *                   or {"type": "torchscript", "path": PATH}: a TorchScript module whose forward takes
 *                   the model's outputs, then the labels, and returns the loss (one element); a
 *                   relative PATH is taken from the configuration file's folder
 *                   (fulgor_model_create_from_file) or the working directory
 *   "optimizer"     {"type": "sgd" | "adam" | "adamw", "lr": number, "momentum": number,
 *                    "weight_decay": number, "betas": [number, number], "eps": number}
 *                   (default {"type": "adam", "lr": 0.001})
 *   "lr_scheduler"  {"type": "step", "step_size": int, "gamma": number} or
 *                   {"type": "cosine", "T_max": int, "eta_min": number}: stepped after every train call
 *   "seed"          an integer: fulgor's seed_everything before anything is made
 *   "buffers"       "host" (default) or "device": where the train and predict buffers are
 *   "strategy"      "auto" (default: ddp under a launcher), "ddp" or "fsdp"
 *   "sharding_strategy"  under "fsdp": "SHARD_GRAD_OP" (gradients and optimizer state sharded) or "NO_SHARD"
 *   "zero_redundancy_optimizer"  under "ddp": true shards the optimizer's state (ZeRO-1)
 *   "state_dict_type"  "full" (default: fulgor_save writes one file, rank 0) or "sharded"
 *                   (a distributed checkpoint's folder, every rank writing its part)
 *   "ddp_timeout"   seconds a collective may take before the ranks fail (default 1800)
 * Sets *model on success. */
FULGOR_C_API fulgor_status fulgor_model_create(const char* torchscript_path, const char* config_json,
                                               fulgor_model** model);

/* fulgor_model_create with the configuration read from the JSON file at
 * `config_path` (a regular file; FULGOR_ERROR_CONFIG when it cannot be read). */
FULGOR_C_API fulgor_status fulgor_model_create_from_file(const char* torchscript_path, const char* config_path,
                                                         fulgor_model** model);

/* Frees the model; a null pointer is ignored, a handle that is not a live
 * model is left alone (fulgor_last_error() says so). */
FULGOR_C_API void fulgor_model_destroy(fulgor_model* model);

/* One training step: the gradients set to none, forward on `input`, the
 * loss against `label`, backward (averaged over the ranks when launched
 * data-parallel), the optimizer's and the scheduler's step. Writes the
 * step's loss to *loss (may be null). An empty batch is FULGOR_ERROR_SHAPE. */
FULGOR_C_API fulgor_status fulgor_train(fulgor_model* model, const void* input, fulgor_dtype input_dtype,
                                        const int64_t* input_shape, int32_t input_rank, const void* label,
                                        fulgor_dtype label_dtype, const int64_t* label_shape, int32_t label_rank,
                                        double* loss);

/* Forward without gradients in evaluation mode, written into `output`,
 * whose shape and dtype must be those of the model's output. */
FULGOR_C_API fulgor_status fulgor_predict(fulgor_model* model, const void* input, fulgor_dtype input_dtype,
                                          const int64_t* input_shape, int32_t input_rank, void* output,
                                          fulgor_dtype output_dtype, const int64_t* output_shape, int32_t output_rank);

/* fulgor_train and fulgor_predict for a model whose forward takes several
 * tensors, inputs[0] to inputs[n_inputs - 1], and returns a tensor or a
 * tuple or list of tensors (TorchFort's multiarg calls). A built-in loss
 * takes one output and one label; a TorchScript loss takes every output,
 * then labels[0] to labels[n_labels - 1]. fulgor_predict_multiarg writes
 * output k into outputs[k], whose shape and dtype must be the model's; it
 * needs as many buffers as the model has outputs. */
FULGOR_C_API fulgor_status fulgor_train_multiarg(fulgor_model* model, const fulgor_tensor* inputs, int32_t n_inputs,
                                                 const fulgor_tensor* labels, int32_t n_labels, double* loss);
FULGOR_C_API fulgor_status fulgor_predict_multiarg(fulgor_model* model, const fulgor_tensor* inputs, int32_t n_inputs,
                                                   const fulgor_tensor* outputs, int32_t n_outputs);

/* The model's parameters, optimizer and scheduler states and step count, in
 * fulgor's checkpoint format (written atomically by rank 0), and back. */
FULGOR_C_API fulgor_status fulgor_save(fulgor_model* model, const char* path);
FULGOR_C_API fulgor_status fulgor_load(fulgor_model* model, const char* path);

/* Where this process stands in its job (0 and 1 without a launcher). */
FULGOR_C_API fulgor_status fulgor_model_rank(const fulgor_model* model, int64_t* rank, int64_t* world_size);

#ifdef __cplusplus
}
#endif

#endif /* FULGOR_C_FULGOR_H */
