#include "memfit/torch/models.h"

#include <torch/torch.h>

#include <stdexcept>

#include "memfit/torch/checkpoint.h"
#include "memfit/torch/recorder.h"

namespace memfit {
namespace {

namespace F = torch::nn::functional;

at::Tensor classification_loss(const at::Tensor& out, const at::Tensor& target,
                               bool mean) {
  auto options = F::CrossEntropyFuncOptions();
  if (mean) {
    options.reduction(torch::kMean);
  } else {
    options.reduction(torch::kSum);
  }
  return F::cross_entropy(out, target, options);
}

// Runs a submodule under its module scope.
template <typename M>
at::Tensor scoped(const char* name, M& m, const at::Tensor& x) {
  ModuleScope scope(name);
  return m->forward(x);
}

// 784-512-512-10 on 28x28 images, 10 classes.
class Mlp final : public TrainableModel {
 public:
  Mlp() {
    fc1_ = root_.register_module("fc1", torch::nn::Linear(784, 512));
    fc2_ = root_.register_module("fc2", torch::nn::Linear(512, 512));
    fc3_ = root_.register_module("fc3", torch::nn::Linear(512, 10));
  }
  std::string name() const override { return "mlp"; }
  torch::nn::Module& module() override { return root_; }
  at::Tensor forward(const at::Tensor& x) override {
    auto h = x.flatten(1);
    h = torch::relu(scoped("fc1", fc1_, h));
    h = torch::relu(scoped("fc2", fc2_, h));
    return scoped("fc3", fc3_, h);
  }
  Batch make_batch(int64_t b, const at::TensorOptions& o,
                   uint64_t seed) const override {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto x = torch::randn({b, 28, 28}, g, o.dtype(torch::kFloat32));
    auto y = torch::randint(0, 10, {b}, g, o.dtype(torch::kLong));
    return {x, y};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t,
                  bool mean) const override {
    return classification_loss(out, t, mean);
  }

 private:
  torch::nn::Module root_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
};

// A residual block: conv-bn-relu-conv-bn + shortcut (a 1x1 convolution,
// followed by BatchNorm with `shortcut_bn` as in torchvision's BasicBlock,
// where the shape changes).
struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride, bool shortcut_bn = false) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(
        in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(
        out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      shortcut = register_module("shortcut", torch::nn::Conv2d(
          torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      if (shortcut_bn) {
        shortcut_norm = register_module("shortcut_bn", torch::nn::BatchNorm2d(out));
      }
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = torch::relu(scoped("bn1", bn1, scoped("conv1", conv1, x)));
    h = scoped("bn2", bn2, scoped("conv2", conv2, h));
    auto s = shortcut ? scoped("shortcut", shortcut, x) : x;
    if (shortcut_norm) s = scoped("shortcut_bn", shortcut_norm, s);
    return torch::relu(h + s);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, shortcut{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, shortcut_norm{nullptr};
};
TORCH_MODULE(ResidualBlock);

// A classifier of 3-channel square images into 10 classes, with BatchNorm
// (which couples the samples of a batch in training).
class ImageClassifier : public TrainableModel {
 public:
  explicit ImageClassifier(int64_t size) : size_(size) {}
  torch::nn::Module& module() override { return root_; }
  Batch make_batch(int64_t b, const at::TensorOptions& o,
                   uint64_t seed) const override {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    return {torch::randn({b, 3, size_, size_}, g, o.dtype(torch::kFloat32)),
            torch::randint(0, 10, {b}, g, o.dtype(torch::kLong))};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t,
                  bool mean) const override {
    return classification_loss(out, t, mean);
  }

 protected:
  torch::nn::Module root_;

 private:
  int64_t size_;
};

// A small ResNet on 3x32x32 images, 10 classes.
class Cnn final : public ImageClassifier {
 public:
  Cnn() : ImageClassifier(32) {
    stem_ = root_.register_module("stem", torch::nn::Conv2d(
        torch::nn::Conv2dOptions(3, 32, 3).padding(1).bias(false)));
    bn_ = root_.register_module("bn", torch::nn::BatchNorm2d(32));
    block1_ = root_.register_module("block1", ResidualBlock(32, 32, 1));
    block2_ = root_.register_module("block2", ResidualBlock(32, 64, 2));
    block3_ = root_.register_module("block3", ResidualBlock(64, 128, 2));
    head_ = root_.register_module("head", torch::nn::Linear(128, 10));
  }
  std::string name() const override { return "cnn"; }
  at::Tensor forward(const at::Tensor& x) override {
    auto h = torch::relu(scoped("bn", bn_, scoped("stem", stem_, x)));
    h = scoped("block1", block1_, h);
    h = scoped("block2", block2_, h);
    h = scoped("block3", block3_, h);
    h = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    return scoped("head", head_, h);
  }

 private:
  torch::nn::Conv2d stem_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
  ResidualBlock block1_{nullptr}, block2_{nullptr}, block3_{nullptr};
  torch::nn::Linear head_{nullptr};
};

// ResNet-18 as torchvision builds it (7x7 stem, max pool, four stages of two
// BasicBlocks, 64-512 channels), on 3x64x64 images, 10 classes.
class ResNet18 final : public ImageClassifier {
 public:
  ResNet18() : ImageClassifier(64) {
    conv1_ = root_.register_module("conv1", torch::nn::Conv2d(
        torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
    bn1_ = root_.register_module("bn1", torch::nn::BatchNorm2d(64));
    int64_t in = 64;
    for (int64_t stage = 0; stage < 4; ++stage) {
      const int64_t out = 64 << stage;
      auto layer = root_.register_module("layer" + std::to_string(stage + 1),
                                         torch::nn::ModuleList());
      for (int64_t i = 0; i < 2; ++i) {
        ResidualBlock block(in, out, i == 0 && stage > 0 ? 2 : 1, true);
        layer->push_back(block);
        blocks_.emplace_back("layer" + std::to_string(stage + 1) + "." + std::to_string(i), block);
        in = out;
      }
    }
    fc_ = root_.register_module("fc", torch::nn::Linear(512, 10));
  }
  std::string name() const override { return "resnet18"; }
  at::Tensor forward(const at::Tensor& x) override {
    auto h = torch::relu(scoped("bn1", bn1_, scoped("conv1", conv1_, x)));
    h = F::max_pool2d(h, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    for (auto& [name, block] : blocks_) h = scoped(name.c_str(), block, h);
    h = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    return scoped("fc", fc_, h);
  }

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<std::pair<std::string, ResidualBlock>> blocks_;
  torch::nn::Linear fc_{nullptr};
};

// One pre-norm decoder block: causal self-attention and an MLP.
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t width, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(
        torch::nn::LayerNormOptions({width})));
    qkv = register_module("qkv", torch::nn::Linear(width, 3 * width));
    proj = register_module("proj", torch::nn::Linear(width, width));
    ln2 = register_module("ln2", torch::nn::LayerNorm(
        torch::nn::LayerNormOptions({width})));
    fc = register_module("fc", torch::nn::Linear(width, 4 * width));
    out = register_module("out", torch::nn::Linear(4 * width, width));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto h = scoped("ln1", ln1, x);
    auto qkv_out = scoped("qkv", qkv, h).view({b, t, 3, heads, c / heads});
    auto q = qkv_out.select(2, 0).transpose(1, 2);
    auto k = qkv_out.select(2, 1).transpose(1, 2);
    auto v = qkv_out.select(2, 2).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) /
               std::sqrt(static_cast<double>(c / heads));
    auto mask = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    att = att.masked_fill(mask, -1e9).softmax(-1);
    auto y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, c});
    auto x1 = x + scoped("proj", proj, y);
    auto m = scoped("out", out, F::gelu(scoped("fc", fc, scoped("ln2", ln2, x1))));
    return x1 + m;
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(GptBlock);

// A decoder-only transformer over token ids, next-token loss.
class Gpt final : public TrainableModel {
 public:
  explicit Gpt(const ModelOptions& o) : o_(o) {
    if (o.width % o.heads != 0) {
      throw std::invalid_argument("[gpt] width " + std::to_string(o.width) +
                                  " is not a multiple of heads " +
                                  std::to_string(o.heads));
    }
    tok_ = root_.register_module("tok", torch::nn::Embedding(o.vocab, o.width));
    pos_ = root_.register_module("pos", torch::nn::Embedding(o.context, o.width));
    blocks_ = root_.register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.layers; ++i) {
      blocks_->push_back(GptBlock(o.width, o.heads));
    }
    ln_ = root_.register_module("ln", torch::nn::LayerNorm(
        torch::nn::LayerNormOptions({o.width})));
    head_ = root_.register_module("head", torch::nn::Linear(
        torch::nn::LinearOptions(o.width, o.vocab).bias(false)));
  }
  std::string name() const override { return "gpt"; }
  torch::nn::Module& module() override { return root_; }
  at::Tensor forward(const at::Tensor& ids) override {
    const int64_t t = ids.size(1);
    auto positions = torch::arange(t, ids.options());
    at::Tensor h;
    {
      ModuleScope s("tok");
      h = tok_->forward(ids);
    }
    {
      ModuleScope s("pos");
      h = h + pos_->forward(positions);
    }
    for (size_t i = 0; i < blocks_->size(); ++i) {
      auto block = blocks_->ptr<GptBlockImpl>(i);
      auto run = [block, name = "blocks." + std::to_string(i)](const at::Tensor& x) {
        ModuleScope s(name);
        return block->forward(x);
      };
      h = i < checkpoint_.size() && checkpoint_[i]
              ? checkpoint(run, h, block->parameters())
              : run(h);
    }
    return scoped("head", head_, scoped("ln", ln_, h));
  }
  Batch make_batch(int64_t b, const at::TensorOptions& o,
                   uint64_t seed) const override {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto ids = torch::randint(0, o_.vocab, {b, o_.context + 1}, g,
                              o.dtype(torch::kLong));
    return {ids.narrow(1, 0, o_.context).contiguous(),
            ids.narrow(1, 1, o_.context).contiguous()};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t,
                  bool mean) const override {
    // Mean over every token of every sample: still a per-sample mean, since
    // all samples have the same number of tokens.
    return classification_loss(out.flatten(0, 1), t.flatten(), mean);
  }
  std::vector<std::string> chain() const override {
    std::vector<std::string> names;
    for (size_t i = 0; i < blocks_->size(); ++i) names.push_back("blocks." + std::to_string(i));
    return names;
  }
  bool set_checkpointing(const std::vector<bool>& blocks) override {
    if (!blocks.empty() && blocks.size() != blocks_->size()) return false;
    checkpoint_ = blocks;
    return true;
  }
  std::vector<bool> checkpointing() const override { return checkpoint_; }

 private:
  ModelOptions o_;
  std::vector<bool> checkpoint_;  // per block; empty: none
  torch::nn::Module root_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear head_{nullptr};
};

// A two-layer LSTM classifier over sequences of 28-dim vectors, batch first.
class Lstm final : public TrainableModel {
 public:
  explicit Lstm(const ModelOptions& o) : o_(o) {
    lstm_ = root_.register_module("lstm", torch::nn::LSTM(
        torch::nn::LSTMOptions(28, o.lstm_hidden).num_layers(2).batch_first(true)));
    head_ = root_.register_module("head", torch::nn::Linear(o.lstm_hidden, 10));
  }
  std::string name() const override { return "lstm"; }
  torch::nn::Module& module() override { return root_; }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor seq;
    {
      ModuleScope s("lstm");
      seq = std::get<0>(lstm_->forward(x));
    }
    return scoped("head", head_, seq.select(1, -1));
  }
  Batch make_batch(int64_t b, const at::TensorOptions& o,
                   uint64_t seed) const override {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    return {torch::randn({b, o_.lstm_steps, 28}, g, o.dtype(torch::kFloat32)),
            torch::randint(0, 10, {b}, g, o.dtype(torch::kLong))};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t,
                  bool mean) const override {
    return classification_loss(out, t, mean);
  }

 private:
  ModelOptions o_;
  torch::nn::Module root_;
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear head_{nullptr};
};

}  // namespace

std::vector<std::string> model_names() { return {"mlp", "cnn", "gpt", "lstm", "resnet18"}; }

namespace {

// Sizes a model is built from: each a positive count (0 or less built a
// model without layers, or divided by zero heads).
void check_options(const ModelOptions& o) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"layers", o.layers},       {"width", o.width},
      {"heads", o.heads},         {"context", o.context},
      {"vocab", o.vocab},         {"lstm_hidden", o.lstm_hidden},
      {"lstm_steps", o.lstm_steps}};
  for (const auto& [name, value] : sizes) {
    if (value < 1) {
      throw std::invalid_argument(std::string("[make_model] --") + name +
                                  " must be at least 1, got " + std::to_string(value));
    }
  }
}

}  // namespace

std::unique_ptr<TrainableModel> make_model(const std::string& name,
                                           const ModelOptions& options) {
  check_options(options);
  if (name == "mlp") return std::make_unique<Mlp>();
  if (name == "cnn") return std::make_unique<Cnn>();
  if (name == "gpt") return std::make_unique<Gpt>(options);
  if (name == "lstm") return std::make_unique<Lstm>(options);
  if (name == "resnet18") return std::make_unique<ResNet18>();
  throw std::invalid_argument("[make_model] unknown model '" + name +
                              "': choose one of mlp, cnn, gpt, lstm, resnet18");
}

}  // namespace memfit
