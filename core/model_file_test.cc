#include "core/model_file.h"

#include <zlib.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/framed_file.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"

namespace kubetrain {
namespace {

ModelFile MakeModelFile(const ModelSpec& spec, uint64_t seed) {
  auto model = Model::Create(spec);
  EXPECT_TRUE(model.ok()) << model.status();
  ModelFile f;
  f.spec = spec;
  f.params = model->InitialParams(seed);
  // Non-trivial biases too, so every variable carries distinct values.
  for (size_t i = 0; i < f.params.size(); ++i) {
    for (size_t j = 0; j < f.params[i].size(); ++j)
      f.params[i][j] += 0.001f * static_cast<float>(i + j);
  }
  f.global_step = 3750;
  f.job_name = "fashion-mnist-sync";
  return f;
}

ModelSpec Mlp() {
  ModelSpec spec;
  spec.type = "mlp";
  spec.hidden_units = {32, 16};
  return spec;
}

void ExpectSame(const ModelFile& a, const ModelFile& b) {
  EXPECT_EQ(a.spec.type, b.spec.type);
  EXPECT_EQ(a.spec.hidden_units, b.spec.hidden_units);
  EXPECT_EQ(a.spec.input_dim, b.spec.input_dim);
  EXPECT_EQ(a.spec.num_classes, b.spec.num_classes);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.global_step, b.global_step);
  EXPECT_EQ(a.job_name, b.job_name);
}

// The payload of a version 1 file, which later versions extend: job, step,
// spec type, hidden layers, input_dim, classes and every variable.
void PutVersionOnePayload(const ModelFile& f, const Model& model, int input_dim, BinaryWriter* w) {
  w->PutString(f.job_name);
  w->PutI64(f.global_step);
  w->PutString(f.spec.type);
  w->PutU32(static_cast<uint32_t>(f.spec.hidden_units.size()));
  for (int h : f.spec.hidden_units) w->PutI32(h);
  w->PutI32(input_dim);
  w->PutI32(f.spec.num_classes);
  w->PutU32(static_cast<uint32_t>(model.variables().size()));
  for (size_t i = 0; i < model.variables().size(); ++i) {
    w->PutString(model.variables()[i].name);
    w->PutI64(model.variables()[i].rows);
    w->PutI64(model.variables()[i].cols);
    w->PutFloats(f.params[i]);
  }
}

TEST(ModelFileTest, SoftmaxRoundTrip) {
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/sub/dir/model.ktm";  // directories are created
  ModelFile f = MakeModelFile(ModelSpec{}, 1);
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, f);
  EXPECT_EQ(ListDir(dir + "/sub/dir"), std::vector<std::string>{"model.ktm"});  // no temp file left
}

TEST(ModelFileTest, LayerListRoundTripWithDatasetAndNormalisation) {
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/cnn.ktm";
  ModelSpec spec;
  spec.type = "layers";
  spec.input_shape = {6, 5, 1};
  LayerSpec conv;
  conv.type = LayerType::kConv2D;
  conv.filters = 3;
  conv.kernel = 3;
  conv.stride = 2;
  conv.same_padding = true;
  conv.activation = Activation::kRelu;
  LayerSpec flatten;
  flatten.type = LayerType::kFlatten;
  LayerSpec dropout;
  dropout.type = LayerType::kDropout;
  dropout.rate = 0.3;
  LayerSpec dense;
  dense.units = 1;
  spec.layers = {conv, flatten, dropout, dense};
  spec.head = HeadType::kSigmoid;
  spec.num_classes = 2;
  ModelFile f = MakeModelFile(spec, 5);
  f.dataset_yaml = "format: csv\ntrainFiles: [a.csv]\n";
  f.norm_mean = {1.5f, 0.0f};
  f.norm_std = {2.0f, 1.0f};
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, f);
  EXPECT_EQ(read->spec.input_shape, spec.input_shape);
  EXPECT_EQ(read->spec.layers, spec.layers);
  EXPECT_EQ(read->spec.head, HeadType::kSigmoid);
  EXPECT_EQ(read->dataset_yaml, f.dataset_yaml);
  EXPECT_EQ(read->norm_mean, f.norm_mean);
  EXPECT_EQ(read->norm_std, f.norm_std);
}

// 2 dense features; lookup ids: two of a (vocabulary 50), one of b (7 ids,
// or dynamic).
ModelSpec WideDeep(bool dynamic_b = false) {
  ModelSpec spec;
  spec.type = "layers";
  spec.input_dim = 2;
  spec.input_shape = {2};
  LayerSpec hidden;
  hidden.units = 4;
  hidden.activation = Activation::kRelu;
  LayerSpec out;
  out.units = 1;
  spec.layers = {hidden, out};
  spec.head = HeadType::kWideAndDeep;
  spec.num_classes = 2;
  spec.sparse_inputs = {{"a", 50, 2}, {"b", dynamic_b ? 0 : 7, 1, dynamic_b}};
  spec.embeddings = {{"a", 3, Combiner::kSqrtn}, {"b", 2, Combiner::kSum}};
  spec.wide.columns = {"b"};
  spec.wide.crossed = {{{"a", "b"}, 11}};
  return spec;
}

// Logits of two examples (dense features and lookup ids) with whole tables.
RowMatrix TwoExamples(const Model& model, const Params& params) {
  const std::vector<float> x = {0.5f, -1, -0.25f, 2};
  const std::vector<int64_t> ids = {3, 49, 6, 0, -1, 1};
  Batch b;
  b.x = x.data();
  b.lookup_ids = ids.data();
  b.size = 2;
  return model.Logits(params, b);
}

TEST(ModelFileTest, WideAndDeepRoundTripKeepsTablesAndSparseFeatures) {
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/wide-deep.ktm";
  const ModelSpec spec = WideDeep();
  ModelFile f = MakeModelFile(spec, 3);
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->tables().size(), 4u);  // 2 embeddings, wide b, wide a_x_b
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, f);  // every table row, exactly
  EXPECT_EQ(read->spec.head, HeadType::kWideAndDeep);
  ASSERT_EQ(read->spec.sparse_inputs.size(), 2u);
  EXPECT_EQ(read->spec.sparse_inputs[0].column, "a");
  EXPECT_EQ(read->spec.sparse_inputs[0].vocab, 50);
  EXPECT_EQ(read->spec.sparse_inputs[0].slots, 2);
  ASSERT_EQ(read->spec.embeddings.size(), 2u);
  EXPECT_EQ(read->spec.embeddings[0].dim, 3);
  EXPECT_EQ(read->spec.embeddings[0].combiner, Combiner::kSqrtn);
  EXPECT_EQ(read->spec.wide.columns, spec.wide.columns);
  ASSERT_EQ(read->spec.wide.crossed.size(), 1u);
  EXPECT_EQ(read->spec.wide.crossed[0].columns, spec.wide.crossed[0].columns);
  EXPECT_EQ(read->spec.wide.crossed[0].hash_buckets, 11);
  // The model read back computes what the written one does.
  auto again = Model::Create(read->spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TwoExamples(*again, read->params), TwoExamples(*model, f.params));
}

TEST(ModelFileTest, AWeightedInputStaysWeighted) {
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/weighted.ktm";
  ModelSpec spec = WideDeep();
  spec.sparse_inputs[1].weighted = true;  // b: embedded and wide, not crossed
  spec.wide.crossed.clear();
  ModelFile f = MakeModelFile(spec, 3);
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->spec.sparse_inputs[0].weighted);
  EXPECT_TRUE(read->spec.sparse_inputs[1].weighted);
  EXPECT_FALSE(read->spec.sparse_inputs[1].dynamic);
}

// The rows of dynamic tables, in memory, a page of `page_rows` at a time.
class FakeRows : public DynamicRowSource {
 public:
  struct Table {
    std::vector<int64_t> ids;
    std::vector<float> values;
  };
  std::map<int, Table> tables;  // by variable
  int64_t page_rows = 2;
  int64_t drop_last = 0;  // rows ForEachPage leaves out (a table that changed)

  absl::StatusOr<int64_t> CountRows(int variable) override {
    return static_cast<int64_t>(tables.at(variable).ids.size());
  }
  absl::Status ForEachPage(int variable, const Page& page) override {
    const Table& t = tables.at(variable);
    const int64_t n = static_cast<int64_t>(t.ids.size()) - drop_last;
    const int64_t dim = static_cast<int64_t>(t.values.size() / std::max<size_t>(1, t.ids.size()));
    for (int64_t i = 0; i < n; i += page_rows) {
      page(t.ids.data() + i, t.values.data() + i * dim, std::min(page_rows, n - i));
    }
    return absl::OkStatus();
  }
};

TEST(ModelFileTest, DynamicTablesHoldOnlyTheirRowsAndReadMissingOnesAsInitialValues) {
  const std::string path = NewTestDir("model_file") + "/dynamic.ktm";
  ModelSpec spec = WideDeep(/*dynamic_b=*/true);
  spec.embeddings[1].max_rows = 1000;
  spec.wide.max_rows = 77;
  ModelFile f = MakeModelFile(spec, 3);
  f.seed = 12345;
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  const int emb = 5, wide = 6;  // embedding.b, wide.b
  ASSERT_TRUE(model->variables()[emb].dynamic && model->variables()[wide].dynamic);
  FakeRows rows;
  const int64_t big = int64_t{0x7fffffffffff0001};
  rows.tables[emb] = {{10, big, 3}, {0.5f, 1.5f, 2.5f, 3.5f, -1, -2}};
  rows.tables[wide] = {{big}, {0.25f}};
  f.params[emb] = {9, 9};  // whatever the chief's params hold there is not written
  f.dynamic_rows = &rows;
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->seed, 12345u);
  EXPECT_TRUE(read->spec.sparse_inputs[1].dynamic);
  EXPECT_EQ(read->spec.embeddings[1].max_rows, 1000);
  EXPECT_EQ(read->spec.wide.max_rows, 77);
  EXPECT_TRUE(read->params[emb].empty());
  // Held rows as written; a missing one is its initial value from the seed.
  std::vector<float> out(2 * 4);
  ASSERT_TRUE(ReadDynamicRows(*read, *model, emb, {big, 7, 10, 3}, out.data()).ok());
  std::vector<float> init7(2);
  InitialTableRow(model->variables()[emb], 12345, 7, init7.data());
  EXPECT_EQ(out, (std::vector<float>{2.5f, 3.5f, init7[0], init7[1], 0.5f, 1.5f, -1, -2}));
  std::vector<float> w(2);
  ASSERT_TRUE(ReadDynamicRows(*read, *model, wide, {big, 10}, w.data()).ok());
  EXPECT_EQ(w, (std::vector<float>{0.25f, 0.0f}));  // wide weights start at 0
  EXPECT_EQ(ReadDynamicRows(*read, *model, 4, {1}, w.data()).code(),
            absl::StatusCode::kInvalidArgument);  // embedding.a is fixed
  // Only the rows are stored: 3 + 1 rows of (id, dim floats) beside the rest.
  ModelFile without = f;
  FakeRows none;
  none.tables[emb] = {};
  none.tables[wide] = {};
  without.dynamic_rows = &none;
  ASSERT_TRUE(WriteModelFile(path + ".empty", without).ok());
  EXPECT_EQ(ReadFile(path).size() - ReadFile(path + ".empty").size(), 3 * (8 + 8) + 1 * (8 + 4));
}

TEST(ModelFileTest, ADynamicTableThatChangesWhileWrittenFailsTheWrite) {
  const std::string dir = NewTestDir("model_file");
  ModelFile f = MakeModelFile(WideDeep(/*dynamic_b=*/true), 3);
  FakeRows rows;
  rows.tables[5] = {{1, 2, 3}, {1, 1, 2, 2, 3, 3}};
  rows.tables[6] = {{1}, {0.5f}};
  rows.drop_last = 1;
  f.dynamic_rows = &rows;
  absl::Status st = WriteModelFile(dir + "/m.ktm", f);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_CONTAINS(std::string(st.message()), "embedding.b listed 2 rows, counted 3");
  EXPECT_TRUE(ListDir(dir).empty());  // nothing written, no temp file left
  f.dynamic_rows = nullptr;
  st = WriteModelFile(dir + "/m.ktm", f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(st.message()), "no rows given for the dynamic table embedding.b");
}

// Version 3 (before dynamic tables) counted one lookup id per sparse input
// in input_dim and the input shape; such files still load and compute the
// same logits.
TEST(ModelFileTest, ReadsVersionThreeFiles) {
  const std::string path = NewTestDir("model_file") + "/v3.ktm";
  const ModelSpec spec = WideDeep();
  ModelFile f = MakeModelFile(spec, 4);
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok());
  BinaryWriter w;
  PutVersionOnePayload(f, *model, spec.input_dim + 3, &w);  // 2 dense features + 3 lookup ids
  w.PutU32(1);
  w.PutI32(spec.input_shape[0] + 3);
  w.PutU32(static_cast<uint32_t>(spec.layers.size()));
  for (const LayerSpec& l : spec.layers) {
    for (int v : {static_cast<int>(l.type), l.units, l.filters, l.kernel, l.stride,
                  l.same_padding ? 1 : 0, static_cast<int>(l.activation)}) {
      w.PutI32(v);
    }
    w.PutU64(0);  // rate 0.0
  }
  w.PutI32(static_cast<int32_t>(spec.head));
  w.PutString("format: csv\n");
  w.PutFloats({});
  w.PutFloats({});
  w.PutU32(2);
  for (const SparseInput& in : spec.sparse_inputs) {
    w.PutString(in.column);
    w.PutI64(in.vocab);
    w.PutI32(in.slots);
  }
  w.PutU32(2);
  for (const EmbeddingSpec& e : spec.embeddings) {
    w.PutString(e.column);
    w.PutI32(e.dim);
    w.PutI32(static_cast<int32_t>(e.combiner));
  }
  w.PutU32(1);
  w.PutString("b");
  w.PutU32(1);
  w.PutU32(2);
  w.PutString("a");
  w.PutString("b");
  w.PutI64(11);
  ASSERT_TRUE(WriteFramedFile(path, "KTMODEL1", 3, w.data()).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->spec.input_dim, 2);
  EXPECT_EQ(read->spec.input_shape, (Shape{2}));
  ExpectSame(*read, f);
  auto again = Model::Create(read->spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TwoExamples(*again, read->params), TwoExamples(*model, f.params));
}

TEST(ModelFileTest, ReadsVersionOneFiles) {
  // The layout before layer lists: the v2 payload without its trailer.
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/old.ktm";
  ModelFile f = MakeModelFile(Mlp(), 9);
  auto model = Model::Create(f.spec);
  BinaryWriter w;
  PutVersionOnePayload(f, *model, f.spec.input_dim, &w);
  ASSERT_TRUE(WriteFramedFile(path, "KTMODEL1", 1, w.data()).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, f);
  EXPECT_TRUE(read->dataset_yaml.empty());
}

TEST(ModelFileTest, MlpRoundTripAndOverwrite) {
  const std::string dir = NewTestDir("model_file");
  const std::string path = dir + "/model.ktm";
  ASSERT_TRUE(WriteModelFile(path, MakeModelFile(ModelSpec{}, 1)).ok());
  ModelFile f = MakeModelFile(Mlp(), 42);
  ASSERT_TRUE(WriteModelFile(path, f).ok());
  auto read = ReadModelFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, f);
  EXPECT_EQ(read->params.size(), 6u);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"model.ktm"});
}

TEST(ModelFileTest, EveryFlippedByteIsDetected) {
  const std::string path = NewTestDir("model_file") + "/model.ktm";
  ModelSpec spec;
  spec.type = "mlp";
  spec.hidden_units = {3};
  spec.input_dim = 4;
  spec.num_classes = 2;
  ASSERT_TRUE(WriteModelFile(path, MakeModelFile(spec, 7)).ok());
  const std::string good = ReadFile(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    WriteFile(path, bad);
    auto f = ReadModelFile(path);
    ASSERT_FALSE(f.ok()) << "flipped byte " << i << " not detected";
    EXPECT_CONTAINS(std::string(f.status().message()), path);
  }
}

TEST(ModelFileTest, CorruptMiddleIsChecksumMismatch) {
  const std::string path = NewTestDir("model_file") + "/model.ktm";
  ASSERT_TRUE(WriteModelFile(path, MakeModelFile(Mlp(), 3)).ok());
  std::string data = ReadFile(path);
  data[data.size() / 2] ^= 0x01;
  WriteFile(path, data);
  auto f = ReadModelFile(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(std::string(f.status().message()), path + ": checksum mismatch");
}

TEST(ModelFileTest, TruncationIsDetected) {
  const std::string path = NewTestDir("model_file") + "/model.ktm";
  ASSERT_TRUE(WriteModelFile(path, MakeModelFile(ModelSpec{}, 3)).ok());
  const std::string good = ReadFile(path);
  WriteFile(path, good.substr(0, good.size() - 1));
  auto f = ReadModelFile(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), absl::StrCat(path, ": truncated: expected ", good.size(),
                                               " bytes, found ", good.size() - 1));
  for (size_t n : {size_t{0}, size_t{5}, size_t{20}, good.size() / 2}) {
    WriteFile(path, good.substr(0, n));
    f = ReadModelFile(path);
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_CONTAINS(std::string(f.status().message()), path + ": truncated");
  }
}

TEST(ModelFileTest, WrongMagic) {
  const std::string path = NewTestDir("model_file") + "/model.ktm";
  ASSERT_TRUE(WriteModelFile(path, MakeModelFile(ModelSpec{}, 3)).ok());
  std::string data = ReadFile(path);
  data.replace(0, 8, "KTCKPT01");  // a checkpoint is not a model
  WriteFile(path, data);
  auto f = ReadModelFile(path);
  EXPECT_EQ(f.status().message(), path + ": not a kubetrain model file (bad magic)");
}

TEST(ModelFileTest, MissingFile) {
  const std::string path = NewTestDir("model_file") + "/missing.ktm";
  auto f = ReadModelFile(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(std::string(f.status().message()), path);
}

TEST(ModelFileTest, WriteRefusesParamsNotMatchingSpec) {
  const std::string path = NewTestDir("model_file") + "/model.ktm";
  ModelFile f = MakeModelFile(Mlp(), 1);
  f.params.pop_back();
  absl::Status st = WriteModelFile(path, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(st.message()), path);
  EXPECT_CONTAINS(std::string(st.message()), "the spec has 6 variables, the parameters have 5");

  f = MakeModelFile(Mlp(), 1);
  f.params[2].push_back(1.0f);
  st = WriteModelFile(path, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(st.message()),
                  "variable dense1/kernel has 513 values, the spec expects 512");

  f = MakeModelFile(Mlp(), 1);
  f.spec.hidden_units.clear();  // invalid mlp spec
  st = WriteModelFile(path, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListDir(path.substr(0, path.rfind('/'))).empty());
}

// Writes a model file whose spec says one thing and whose variables another
// (as a buggy or foreign writer might), with a valid checksum.
TEST(ModelFileTest, ReadDetectsSpecParamsMismatch) {
  const std::string dir = NewTestDir("model_file");
  ModelFile a = MakeModelFile(Mlp(), 1);
  ASSERT_TRUE(WriteModelFile(dir + "/a.ktm", a).ok());
  std::string data = ReadFile(dir + "/a.ktm");
  // Payload layout: job_name (u32 len + bytes), global_step (i64), type
  // (u32 len + bytes), n_hidden (u32), hidden units (i32 each).
  const size_t header = 20;
  size_t off = header + 4 + a.job_name.size() + 8 + 4 + a.spec.type.size() + 4;
  ASSERT_EQ(static_cast<unsigned char>(data[off + 4]), 16u);  // second hidden layer
  data[off + 4] = 8;                                          // spec now says [32, 8]
  // Recompute the CRC so only the semantic check can catch it.
  const std::string payload = data.substr(header, data.size() - header - 4);
  const uint32_t crc = static_cast<uint32_t>(
      ::crc32_z(0L, reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  for (int i = 0; i < 4; ++i)
    data[data.size() - 4 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  WriteFile(dir + "/a.ktm", data);
  auto f = ReadModelFile(dir + "/a.ktm");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(std::string(f.status().message()),
                  dir + "/a.ktm: variables do not match the model spec");
  EXPECT_CONTAINS(std::string(f.status().message()),
                  "dense1/kernel has shape [32, 16], the spec expects [32, 8]");
}

}  // namespace
}  // namespace kubetrain
