#include "core/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "core/error.h"

namespace bp {
namespace {

TEST(Interrupt, FirstSignalSetsTheFlagSecondExitsWith130) {
  EXPECT_EXIT(
      {
        install_interrupt_handler();
        if (interrupt_requested()) _exit(1);
        raise(SIGINT);
        if (!interrupt_requested() || interrupt_signal() != SIGINT) _exit(2);
        raise(SIGTERM);  // second signal
        _exit(3);
      },
      ::testing::ExitedWithCode(130), "Interrupt received");
}

// The Python package's KeyboardInterrupt and callback stop: the flag as a signal would set it, the
// first request kept, no handler involved (so never the second signal's exit).
TEST(Interrupt, RequestSetsTheFlagOnceWithoutASignal) {
  clear_interrupt();
  request_interrupt(SIGINT);
  EXPECT_TRUE(interrupt_requested());
  EXPECT_EQ(interrupt_signal(), SIGINT);
  request_interrupt(SIGTERM);
  EXPECT_EQ(interrupt_signal(), SIGINT) << "the first request stands";
  clear_interrupt();
  EXPECT_FALSE(interrupt_requested());
}

TEST(Interrupt, AbortedTrainingMapsToExitCode130) {
  EXPECT_EQ(exit_code_for(ErrorCode::RUNTIME_TRAINING_ABORTED), 130);
}

}  // namespace
}  // namespace bp
