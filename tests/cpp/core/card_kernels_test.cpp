#include "memfit/core/model/card_kernels.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace memfit {
namespace {

constexpr int64_t kFloat = 4;

// A Linear's bias gradient: the sum over the batch of a [batch, 512] float
// gradient. At the batch an H200 ran out on (14712), 230 blocks per output,
// 128 lanes each: 60293120 B, the 58 MiB the card asked for.
TEST(CudaReduceBuffersTest, BiasGradientOfAWideBatchTakesEightBytesAnElement) {
  const ReduceBuffers b = cuda_reduce_buffers({14712, 512}, {0}, kFloat, kFloat);
  EXPECT_EQ(b.buffer, int64_t{4} * 512 * 230 * 32 * 4);
  EXPECT_EQ(b.buffer, 60293120);
  EXPECT_EQ(b.semaphores, 4 * 4);  // 512 outputs / 4 per lane / 32 lanes
  EXPECT_EQ(b.total(), 60293136);
}

TEST(CudaReduceBuffersTest, BiasGradientAt1024TakesFourMiB) {
  // 1024 / 4 warps = 256 values a thread: the least that splits the blocks;
  // ceil(256 / 16) = 16 blocks per output.
  const ReduceBuffers b = cuda_reduce_buffers({1024, 512}, {0}, kFloat, kFloat);
  EXPECT_EQ(b.buffer, int64_t{4} << 20);
  EXPECT_EQ(b.semaphores, 16);
}

TEST(CudaReduceBuffersTest, SmallBatchReducesInOneBlock) {
  EXPECT_EQ(cuda_reduce_buffers({64, 512}, {0}, kFloat, kFloat).total(), 0);
  EXPECT_EQ(cuda_reduce_buffers({1020, 512}, {0}, kFloat, kFloat).total(), 0);
}

TEST(CudaReduceBuffersTest, ConvolutionBiasSplitsOnlyAtALargeBatch) {
  // [N, 64, 32, 32] summed over N, H, W: lanes and warps split the 32x32
  // plane; 32 images leave 64 values a thread, 256 leave 512.
  EXPECT_EQ(cuda_reduce_buffers({32, 64, 32, 32}, {0, 2, 3}, kFloat, kFloat).total(), 0);
  const ReduceBuffers b = cuda_reduce_buffers({256, 64, 32, 32}, {0, 2, 3}, kFloat, kFloat);
  // min(ceil(528 blocks the card holds / 64 outputs), ceil(512 / 16)) = 9
  // blocks per output, one accumulator each (lanes reduce).
  EXPECT_EQ(b.buffer, 4 * 64 * 9);
  EXPECT_EQ(b.semaphores, 4 * 64);
}

TEST(CudaReduceBuffersTest, FullReductionKeepsOneAccumulatorPerBlock) {
  const ReduceBuffers b = cuda_reduce_buffers({1 << 20}, {}, kFloat, kFloat);
  EXPECT_EQ(b.buffer, 4 * 128);  // ceil(2048 values a thread / 16) blocks
  EXPECT_EQ(b.semaphores, 4);
}

TEST(CudaReduceBuffersTest, NegativeDimsCountFromTheEnd) {
  EXPECT_EQ(cuda_reduce_buffers({14712, 512}, {-2}, kFloat, kFloat).buffer, 60293120);
  EXPECT_THROW(cuda_reduce_buffers({4, 4}, {2}, kFloat, kFloat), std::invalid_argument);
}

TEST(CudaReduceBuffersTest, DoubleAccumulatesInEightBytes) {
  EXPECT_EQ(cuda_reduce_buffers({14712, 512}, {0}, 8, 8).buffer, 2 * 60293120);
}

// Winograd's transforms, exact where cuDNN ran it on an H200 (resnet18 at
// 16 x 64x64): 256 channels at 4x4, 64 at 16x16.
TEST(CudnnConvWorkspaceTest, WinogradTransformsOfEachOperand) {
  EXPECT_EQ(cudnn_conv_backward_workspace({16 * 256 * 16, 16 * 256 * 16, 256 * 256 * 9}),
            10616832);
  EXPECT_EQ(cudnn_conv_backward_workspace({16 * 64 * 256, 16 * 64 * 256, 64 * 64 * 9}),
            5308416);
}

// The forward's bound: Winograd's transforms of x's and y's tiles and of w.
// Above each workspace cuDNN took in the H200 fixtures' forwards: resnet18's
// 512 channels at 2x2, batch 16, took 9699631 B; the cnn's 64 at 16x16,
// batch 32, 4341776 B.
TEST(CudnnConvWorkspaceTest, AForwardsBoundIsAboveWhatCudnnTookOnAnH200) {
  EXPECT_EQ(cudnn_conv_forward_workspace({16 * 512 * 4, 16 * 512 * 4, 512 * 512 * 9}), 38338560);
  EXPECT_GT(38338560, 9699631);
  EXPECT_EQ(cudnn_conv_forward_workspace({32 * 64 * 256, 32 * 64 * 256, 64 * 64 * 9}), 10027008);
  EXPECT_GT(10027008, 4341776);
  EXPECT_EQ(cudnn_conv_forward_workspace({64, 36, 9}), 4 * (9 * (64 + 36) / 4 + 4 * 9));
}

// Note [cuDNN's workspace at the step's peak]: a step live at 100 B where its
// one convolution's backward returns, peaking at 1100 B later.
Timeline one_convolution_then_a_peak() {
  Timeline tl;
  tl.begin_phase("backward", 1);
  const uint16_t phase = tl.current_phase();
  const uint32_t mark = tl.op_index(kCudnnWorkspaceMark);
  auto ev = [&](uint64_t id, int64_t bytes, EventKind kind, uint32_t op) {
    Event e;
    e.id = id;
    e.bytes = bytes;
    e.kind = kind;
    e.op = op;
    e.phase = phase;
    tl.record(e);
  };
  ev(1, 100, EventKind::kAlloc, 0);
  ev(2, 0, EventKind::kAlloc, mark);
  ev(2, 0, EventKind::kFree, mark);
  ev(3, 1000, EventKind::kAlloc, 0);
  ev(3, 1000, EventKind::kFree, 0);
  ev(1, 100, EventKind::kFree, 0);
  return tl;
}

TEST(CudnnWorkspaceAtPeakTest, ABoundBelowThePeakAddsNothing) {
  const ConvWorkspaceAtPeak w = cudnn_workspace_at_peak(one_convolution_then_a_peak(), {1000});
  EXPECT_EQ(w.convolutions, 1);
  EXPECT_EQ(w.bytes, 0);  // 100 + 1000 reaches the peak, no more
}

TEST(CudnnWorkspaceAtPeakTest, ABoundAboveThePeakAddsWhatItPassesItBy) {
  const ConvWorkspaceAtPeak w = cudnn_workspace_at_peak(one_convolution_then_a_peak(), {1500});
  EXPECT_EQ(w.bytes, 100 + 1500 - 1100);
  EXPECT_EQ(w.phase, "backward");
}

TEST(CudnnWorkspaceAtPeakTest, MarksLeftOutTakeTheLargestBound) {
  const ConvWorkspaceAtPeak w =
      cudnn_workspace_at_peak(one_convolution_then_a_peak(), {300, 700});
  EXPECT_EQ(w.bytes, 700);
}

TEST(CudnnWorkspaceAtPeakTest, NoConvolutionNoNote) {
  const ConvWorkspaceAtPeak w = cudnn_workspace_at_peak(one_convolution_then_a_peak(), {});
  EXPECT_EQ(w.convolutions, 0);
  EXPECT_EQ(cudnn_workspace_note(w), "");
  EXPECT_EQ(cudnn_workspace_in_notes({"another note"}), -1);
}

TEST(CudnnWorkspaceAtPeakTest, TheNoteSaysItsBytesBack) {
  // 256 channels at 4x4, batch 16 (Note [cuDNN's convolution workspace]).
  const int64_t bound =
      cudnn_conv_backward_workspace({16 * 256 * 16, 16 * 256 * 16, 256 * 256 * 9});
  EXPECT_EQ(bound, 10616832);  // 4 B x (9/4 x 2 x 65536 + 4 x 589824)
  const std::string note = cudnn_workspace_note({3, bound, "backward", 16});
  EXPECT_EQ(note.rfind("cuDNN convolutions' workspaces are not counted: at batch 16, on a free "
                       "card they can raise the peak allocated bytes by up to ",
                       0),
            0u)
      << note;
  EXPECT_NE(note.find("(10616832 B), in backward"),
            std::string::npos)
      << note;
  EXPECT_EQ(cudnn_workspace_in_notes({"another note", note}), bound);
  EXPECT_EQ(cudnn_workspace_in_notes({cudnn_workspace_note({1, 0, ""})}), 0);
}

}  // namespace
}  // namespace memfit
