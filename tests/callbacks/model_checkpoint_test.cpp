// ModelCheckpoint's decisions, each written from Lightning 2.6's
// callbacks/model_checkpoint.py.

#include <cmath>
#include <limits>
#include <set>

#include "../support/tiny.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The set-up of the reports: 64 training and 32 validation samples in batches
// of 8 (8 optimizer steps per epoch), SGD 0.1; validation logs `val_loss` from
// the model's script, one value per validation run.
struct Scenario {
  TempDir dir;
  TinyNet model;
  std::shared_ptr<ModelCheckpoint> checkpoint;
  TrainerOptions options;

  Scenario(std::vector<double> val_losses, ModelCheckpointOptions checkpoint_options, int64_t epochs) {
    model.scripted_val = std::move(val_losses);
    if (checkpoint_options.dirpath.empty()) checkpoint_options.dirpath = (dir.path / "ckpt").string();
    checkpoint = std::make_shared<ModelCheckpoint>(checkpoint_options);
    options = quiet(dir, epochs, {checkpoint});
  }
  void fit() {
    auto train = sequential_loader(64, 8);
    auto val = sequential_loader(32, 8, 8);
    Trainer trainer(options);
    trainer.fit(model, train, val);
  }
  std::set<std::string> files() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(checkpoint->dirpath())) names.insert(e.path().filename().string());
    return names;
  }
  std::string name(const std::string& path) const { return fs::path(path).filename().string(); }
  int64_t step_in(const std::string& file) const {
    return read_checkpoint_meta((fs::path(checkpoint->dirpath()) / file).string()).at("loop").at("global_step");
  }
};

// A NaN score is the worst: it is not kept over a real one, and a later
// real score replaces it (the NaN becomes +inf in "min" mode).
TEST(ModelCheckpoint, ANanScoreIsTheWorstAndDoesNotBlockLaterSaves) {
  Scenario one({kNaN, 0.5, 0.7, 0.3}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 1}, 4);
  one.fit();
  EXPECT_EQ(one.files(), (std::set<std::string>{"epoch=3.ckpt"}));
  EXPECT_EQ(one.name(one.checkpoint->best_model_path()), "epoch=3.ckpt");
  EXPECT_DOUBLE_EQ(one.checkpoint->best_model_score().value_or(kNaN), 0.3);

  // With room for two, the NaN takes the free place and the next real
  // score (0.7, worse than 0.5 but better than NaN) pushes it out.
  Scenario two({0.5, kNaN, 0.7, 0.3}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 2}, 4);
  two.fit();
  EXPECT_EQ(two.files(), (std::set<std::string>{"epoch=0.ckpt", "epoch=3.ckpt"}));
  EXPECT_EQ(two.name(two.checkpoint->best_model_path()), "epoch=3.ckpt");

  // "max" mode: NaN is -inf.
  Scenario max({kNaN, 0.5}, {.filename = "{epoch}", .monitor = "val_loss", .mode = "max", .save_top_k = 1}, 2);
  max.fit();
  EXPECT_EQ(max.files(), (std::set<std::string>{"epoch=1.ckpt"}));
  EXPECT_DOUBLE_EQ(max.checkpoint->best_model_score().value_or(kNaN), 0.5);

  // Only NaN so far: it is kept, with the worst score.
  Scenario only({kNaN}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 1}, 1);
  only.fit();
  EXPECT_EQ(only.files(), (std::set<std::string>{"epoch=0.ckpt"}));
  EXPECT_DOUBLE_EQ(only.checkpoint->best_model_score().value_or(kNaN), std::numeric_limits<double>::infinity());
}

// A name without a metric in it is versioned (Lightning's
// _get_metric_interpolated_filepath_name: "-v1", "-v2", ... while the file
// exists, except the one being replaced) instead of overwriting a kept file.
TEST(ModelCheckpoint, AConstantFilenameIsVersionedInsteadOfOverwritten) {
  Scenario run({0.5, 0.4, 0.6, 0.3}, {.filename = "best", .monitor = "val_loss", .save_top_k = 2}, 4);
  run.fit();
  // Epoch 0 writes best.ckpt, epoch 1 best-v1.ckpt; epoch 2 is not in the top
  // 2; epoch 3 replaces the worse of the two, best.ckpt, under its own name.
  EXPECT_EQ(run.files(), (std::set<std::string>{"best.ckpt", "best-v1.ckpt"}));
  EXPECT_EQ(run.step_in("best-v1.ckpt"), 16);
  EXPECT_EQ(run.step_in("best.ckpt"), 32);
  EXPECT_EQ(run.name(run.checkpoint->best_model_path()), "best.ckpt");
  EXPECT_DOUBLE_EQ(run.checkpoint->best_model_score().value_or(kNaN), 0.3);

  // enable_version_counter=false overwrites, as Lightning does.
  Scenario plain({0.5, 0.4},
                 {.filename = "best", .monitor = "val_loss", .save_top_k = 2, .enable_version_counter = false}, 2);
  plain.fit();
  EXPECT_EQ(plain.files(), (std::set<std::string>{"best.ckpt"}));
  EXPECT_EQ(plain.step_in("best.ckpt"), 16);
}

// Without a monitor nothing is ranked: Lightning's best_model_score stays
// None and best_k_models empty, and best_model_path is the latest file.
TEST(ModelCheckpoint, WithoutAMonitorThereIsNoBestScore) {
  Scenario run({0.5, 0.4}, {.filename = "{epoch}"}, 2);
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"epoch=1.ckpt"}));
  EXPECT_EQ(run.name(run.checkpoint->best_model_path()), "epoch=1.ckpt");
  EXPECT_FALSE(run.checkpoint->best_model_score().has_value());
  EXPECT_TRUE(run.checkpoint->best_k_models().empty());
  EXPECT_EQ(run.checkpoint->kth_best_model_path(), "");
}

// The k-th best is the worst of the k kept (_update_best_and_save), set once
// k files are kept; until then kth_value is the mode's worst value.
TEST(ModelCheckpoint, TheKthBestIsTheWorstOfTheKKept) {
  Scenario partial({0.5, 0.4}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 3}, 2);
  partial.fit();
  EXPECT_EQ(partial.checkpoint->kth_best_model_path(), "");
  EXPECT_DOUBLE_EQ(partial.checkpoint->kth_value(), std::numeric_limits<double>::infinity());

  Scenario full({0.5, 0.4, 0.6, 0.3}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 3}, 4);
  full.fit();
  // After epoch 2 the kept are 0.5, 0.4, 0.6 (k-th: 0.6); 0.3 replaces it.
  EXPECT_EQ(full.files(), (std::set<std::string>{"epoch=0.ckpt", "epoch=1.ckpt", "epoch=3.ckpt"}));
  EXPECT_EQ(full.name(full.checkpoint->kth_best_model_path()), "epoch=0.ckpt");
  EXPECT_DOUBLE_EQ(full.checkpoint->kth_value(), 0.5);

  Scenario max({0.5, 0.4, 0.6}, {.filename = "{epoch}", .monitor = "val_loss", .mode = "max", .save_top_k = 2}, 3);
  max.fit();
  EXPECT_EQ(max.name(max.checkpoint->kth_best_model_path()), "epoch=0.ckpt");
  EXPECT_DOUBLE_EQ(max.checkpoint->kth_value(), 0.5);
}

// Lightning's format_checkpoint_name: every group takes its format spec,
// epoch and step included, and auto_insert_metric_name (the default) puts
// "name=" where the group begins. A missing metric is 0.
TEST(ModelCheckpoint, FormatSpecsApplyToEpochAndStep) {
  const std::map<std::string, double> metrics{{"epoch", 3}, {"step", 12}, {"val_loss", 0.4}};
  ModelCheckpoint plain({.filename = "e{epoch:02d}_{val_loss:.3f}", .auto_insert_metric_name = false});
  EXPECT_EQ(plain.format_checkpoint_name(metrics), "e03_0.400");
  ModelCheckpoint named({.filename = "e{epoch:02d}_{val_loss:.3f}"});
  EXPECT_EQ(named.format_checkpoint_name(metrics), "eepoch=03_val_loss=0.400");
  // Lightning's own examples.
  EXPECT_EQ(ModelCheckpoint({.filename = "{epoch:03d}"}).format_checkpoint_name({{"epoch", 5}}), "epoch=005");
  EXPECT_EQ(ModelCheckpoint({.filename = "{epoch}-{val_loss:.2f}"})
                .format_checkpoint_name({{"epoch", 2}, {"val_loss", 0.123456}}),
            "epoch=2-val_loss=0.12");
  EXPECT_EQ(ModelCheckpoint({.filename = "{missing:d}"}).format_checkpoint_name({}), "missing=0");
  EXPECT_EQ(ModelCheckpoint({.filename = "{step:05d}"}).format_checkpoint_name(metrics), "step=00012");
  EXPECT_EQ(ModelCheckpoint(ModelCheckpointOptions{}).format_checkpoint_name(metrics), "epoch=3-step=12");

  Scenario run({0.5, 0.45, 0.42, 0.4},
               {.filename = "e{epoch:02d}_{val_loss:.3f}", .monitor = "val_loss", .auto_insert_metric_name = false}, 4);
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"e03_0.400.ckpt"}));
}

// With several validation runs per epoch Lightning saves after each of them
// (_should_save_on_train_epoch_end is false when val_check_interval != 1.0
// and there are validation batches).
TEST(ModelCheckpoint, SavesAfterEveryValidationRunWithinAnEpoch) {
  Scenario run({0.5, 0.4, 0.3, 0.2}, {.monitor = "val_loss", .save_top_k = -1}, 2);
  run.options.val_check_interval = 0.5;
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt",
                                                "epoch=1-step=16.ckpt"}));
  EXPECT_EQ(run.name(run.checkpoint->best_model_path()), "epoch=1-step=16.ckpt");
}

// With check_val_every_n_epoch != 1 the save follows validation, so the
// epochs without it save nothing (and miss no metric).
TEST(ModelCheckpoint, WithCheckValEveryNEpochItSavesAfterValidation) {
  Scenario run({0.5, 0.4}, {.monitor = "val_loss", .save_top_k = -1}, 4);
  run.options.check_val_every_n_epoch = 2;
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"epoch=1-step=16.ckpt", "epoch=3-step=32.ckpt"}));
}

// Lightning's on_train_epoch_end / on_validation_end write last.ckpt only
// when a top-k checkpoint was saved at the same step.
TEST(ModelCheckpoint, LastIsRewrittenOnlyWithATopKSave) {
  Scenario run({0.5, 0.6, 0.4, 0.7}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 1, .save_last = true},
               4);
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"epoch=2.ckpt", "last.ckpt"}));
  EXPECT_EQ(run.step_in("last.ckpt"), 24);
  EXPECT_EQ(run.name(run.checkpoint->last_model_path()), "last.ckpt");
}

// train_time_interval: Lightning allows a zero interval, which saves after
// every training batch; the epoch-based save is then off.
TEST(ModelCheckpoint, AZeroTrainTimeIntervalSavesAfterEveryBatch) {
  Scenario run({0.5}, {.filename = "{step}", .save_top_k = -1, .train_time_interval = std::chrono::seconds(0)}, 1);
  run.fit();
  EXPECT_EQ(run.files(), (std::set<std::string>{"step=1.ckpt", "step=2.ckpt", "step=3.ckpt", "step=4.ckpt",
                                                "step=5.ckpt", "step=6.ckpt", "step=7.ckpt", "step=8.ckpt"}));
}

// A monitored metric that only validation logs: a step-based save waits for
// the validation after it instead of failing (Lightning's
// _defer_save_until_validation), and no step is saved twice.
TEST(ModelCheckpoint, AStepSaveWaitsForTheValidationThatLogsTheMonitor) {
  Scenario run({0.5, 0.4, 0.3, 0.2},
               {.filename = "{step}", .monitor = "val_loss", .save_top_k = -1, .every_n_train_steps = 3}, 2);
  run.options.val_check_interval = 0.5;  // validation after steps 4, 8, 12, 16
  run.fit();
  // Step 3 has no val_loss yet: saved after the validation at step 4. Steps 6,
  // 9, 12 and 15 save at once; the validation at step 12 does not save again.
  EXPECT_EQ(run.files(),
            (std::set<std::string>{"step=4.ckpt", "step=6.ckpt", "step=9.ckpt", "step=12.ckpt", "step=15.ckpt"}));
}

// state_dict carries Lightning's keys; load_state_dict trusts the ranked
// files only when the folder is the same, and keeps best_model_path always.
TEST(ModelCheckpoint, StateDictCarriesLightningsKeys) {
  Scenario run({0.5, 0.4}, {.filename = "{epoch}", .monitor = "val_loss", .save_top_k = 2, .save_last = true}, 2);
  run.fit();
  const auto state = run.checkpoint->state_dict();
  std::set<std::string> keys;
  for (const auto& item : state.items()) keys.insert(item.key());
  EXPECT_EQ(keys, (std::set<std::string>{"monitor", "best_model_score", "best_model_path", "current_score", "dirpath",
                                         "best_k_models", "kth_best_model_path", "kth_value", "last_model_path"}));
  EXPECT_EQ(state.at("monitor"), "val_loss");
  EXPECT_DOUBLE_EQ(state.at("best_model_score").get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(state.at("current_score").get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(state.at("kth_value").get<double>(), 0.5);

  ModelCheckpoint same({.dirpath = run.checkpoint->dirpath(), .monitor = "val_loss", .save_top_k = 2});
  same.load_state_dict(state);
  EXPECT_EQ(same.best_k_models(), run.checkpoint->best_k_models());
  EXPECT_EQ(same.best_model_path(), run.checkpoint->best_model_path());
  EXPECT_DOUBLE_EQ(same.best_model_score().value_or(kNaN), 0.4);
  EXPECT_EQ(same.kth_best_model_path(), run.checkpoint->kth_best_model_path());
  EXPECT_DOUBLE_EQ(same.kth_value(), 0.5);
  EXPECT_EQ(same.last_model_path(), run.checkpoint->last_model_path());

  ModelCheckpoint moved({.dirpath = (run.dir.path / "elsewhere").string(), .monitor = "val_loss", .save_top_k = 2});
  moved.load_state_dict(state);
  EXPECT_EQ(moved.best_model_path(), run.checkpoint->best_model_path());
  EXPECT_TRUE(moved.best_k_models().empty());
  EXPECT_FALSE(moved.best_model_score().has_value());
  EXPECT_EQ(moved.kth_best_model_path(), "");
  EXPECT_EQ(moved.last_model_path(), "");
}

// A resumed run with the default folder (resolved in setup, as Lightning's
// __resolve_ckpt_dir) keeps ranking the files saved before the resume: the
// pre-resume best stays best until a better one comes, then it is removed.
TEST(ModelCheckpoint, AResumedRunKeepsRankingThePreResumeFiles) {
  TempDir dir;
  const fs::path folder = dir.path / "checkpoints";
  auto train = sequential_loader(64, 8);
  auto val = sequential_loader(32, 8, 8);
  const ModelCheckpointOptions best_one{.filename = "{epoch}", .monitor = "val_loss", .save_last = true};
  {
    TinyNet model;
    model.scripted_val = {0.5, 0.4};
    Trainer trainer(quiet(dir, 2, {std::make_shared<ModelCheckpoint>(best_one)}));
    trainer.fit(model, train, val);
  }
  ASSERT_TRUE(fs::exists(folder / "epoch=1.ckpt"));
  TinyNet model;
  model.scripted_val = {0.45, 0.3};
  auto checkpoint = std::make_shared<ModelCheckpoint>(best_one);
  std::string best_in_epoch_3;
  auto probe = std::make_shared<Hooks>();
  probe->batch_end = [&](Trainer& t, int64_t i) {
    if (t.current_epoch() == 3 && i == 0) best_in_epoch_3 = checkpoint->best_model_path();
  };
  Trainer trainer(quiet(dir, 4, {probe, checkpoint}));
  trainer.fit(model, train, val, {.ckpt_path = (folder / "last.ckpt").string()});
  // Epoch 2 (0.45) is not better than the pre-resume epoch 1 (0.4).
  EXPECT_EQ(fs::path(best_in_epoch_3).filename(), "epoch=1.ckpt");
  // Epoch 3 (0.3) is, and replaces it.
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(folder)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"epoch=3.ckpt", "last.ckpt"}));
  EXPECT_EQ(fs::path(checkpoint->best_model_path()).filename(), "epoch=3.ckpt");
  EXPECT_DOUBLE_EQ(checkpoint->best_model_score().value_or(kNaN), 0.3);
}

// every_n_train_steps with save_last: a file every third step, and last.ckpt
// at the fit's end.
TEST(ModelCheckpoint, SavesEveryNTrainStepsAndTheLast) {
  TempDir dir;
  auto model = adam_step_lr_net(21, 0.3);
  auto train = sequential_loader(32, 8);  // 4 steps per epoch
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.filename = "{step}", .save_top_k = -1, .save_last = true, .every_n_train_steps = 3});
  auto options = quiet(dir, 2, {checkpoint});
  Trainer trainer(options);
  trainer.fit(*model, train);
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path / "checkpoints")) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"step=3.ckpt", "step=6.ckpt", "last.ckpt"}));
  EXPECT_EQ(read_checkpoint_meta((dir.path / "checkpoints" / "last.ckpt").string()).at("loop").at("global_step"), 6);
}

}  // namespace
}  // namespace fulgor::testing
