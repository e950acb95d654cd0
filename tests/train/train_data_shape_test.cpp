// The trainer's data for each training.method (issue 38): build_train_data reads the method's data
// shape (pairs for dpo/orpo/simpo, labelled completions for kto, pairs unpaired; sft refuses
// preference files), and a pair's label tokens count both of its sequences.
#include <gtest/gtest.h>

#include "core/error.h"
#include "support/test_util.h"
#include "text/tokenizer.h"
#include "train/train_data.h"
#include "train/train_options.h"

namespace bp::test {
namespace {

TEST(TrainDataShape, EachMethodReadsItsShape) {
  EXPECT_EQ(method_data_shape(TrainMethod::Sft), DataShape::Single);
  EXPECT_EQ(method_data_shape(TrainMethod::Dpo), DataShape::Pair);
  EXPECT_EQ(method_data_shape(TrainMethod::Orpo), DataShape::Pair);
  EXPECT_EQ(method_data_shape(TrainMethod::Simpo), DataShape::Pair);
  EXPECT_EQ(method_data_shape(TrainMethod::Kto), DataShape::Labelled);
}

TEST(TrainDataShape, BuildTrainDataFollowsTheMethod) {
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(source_dir() + "/models/tiny-chat");
  TrainOptions o;
  o.device = "cpu";  // only the data is built, but every TrainOptions of the tests pins the CPU
  o.data_path = source_dir() + "/examples/preference/pairs.jsonl";
  o.holdout = 0;
  o.method = TrainMethod::Dpo;
  const TrainData pairs = build_train_data(o, *tok);
  EXPECT_EQ(pairs.format, "preference");
  ASSERT_EQ(pairs.train.size(), 64u);
  for (const Sample& s : pairs.train) {
    ASSERT_TRUE(s.is_pair());
    EXPECT_EQ(sample_label_tokens(s), std::count(s.loss_mask.begin() + 1, s.loss_mask.end(), 1) +
                                          std::count(s.rejected_loss_mask.begin() + 1, s.rejected_loss_mask.end(), 1));
  }
  o.method = TrainMethod::Kto;
  const TrainData unpaired = build_train_data(o, *tok);
  ASSERT_EQ(unpaired.train.size(), 128u);
  for (size_t k = 0; k < unpaired.train.size(); ++k) EXPECT_EQ(unpaired.train[k].label, k % 2 == 0 ? 1 : 0);
  o.method = TrainMethod::Sft;
  try {
    build_train_data(o, *tok);
    FAIL() << "sft must refuse preference pairs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_WRONG_SHAPE) << e.what();
  }
}

}  // namespace
}  // namespace bp::test
