#include "memfit/core/model/snapshot_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace memfit {
namespace {

// Python's pickle.dumps(snapshot, protocol=4) of a snapshot in torch's
// format: a 2 MiB segment with one block, and a trace of segment_alloc,
// alloc (two frames, the very list object the block holds), oom.
const std::vector<unsigned char> kSnapshot = {
    128, 4, 149, 21, 2, 0, 0, 0, 0, 0, 0, 125, 148, 40, 140, 8, 115, 101, 103, 109, 101,
    110, 116, 115, 148, 93, 148, 125, 148, 40, 140, 6, 100, 101, 118, 105, 99, 101, 148,
    75, 0, 140, 7, 97, 100, 100, 114, 101, 115, 115, 148, 77, 0, 16, 140, 10, 116, 111,
    116, 97, 108, 95, 115, 105, 122, 101, 148, 74, 0, 0, 32, 0, 140, 6, 115, 116, 114,
    101, 97, 109, 148, 75, 0, 140, 12, 115, 101, 103, 109, 101, 110, 116, 95, 116, 121,
    112, 101, 148, 140, 5, 115, 109, 97, 108, 108, 148, 140, 14, 97, 108, 108, 111, 99,
    97, 116, 101, 100, 95, 115, 105, 122, 101, 148, 77, 0, 2, 140, 11, 97, 99, 116, 105,
    118, 101, 95, 115, 105, 122, 101, 148, 77, 0, 2, 140, 6, 98, 108, 111, 99, 107, 115,
    148, 93, 148, 125, 148, 40, 104, 5, 77, 0, 16, 140, 4, 115, 105, 122, 101, 148, 77,
    0, 2, 140, 14, 114, 101, 113, 117, 101, 115, 116, 101, 100, 95, 115, 105, 122, 101,
    148, 75, 100, 140, 5, 115, 116, 97, 116, 101, 148, 140, 16, 97, 99, 116, 105, 118,
    101, 95, 97, 108, 108, 111, 99, 97, 116, 101, 100, 148, 140, 6, 102, 114, 97, 109,
    101, 115, 148, 93, 148, 40, 125, 148, 40, 140, 8, 102, 105, 108, 101, 110, 97, 109,
    101, 148, 140, 4, 97, 46, 112, 121, 148, 140, 4, 108, 105, 110, 101, 148, 75, 3,
    140, 4, 110, 97, 109, 101, 148, 140, 1, 102, 148, 117, 125, 148, 40, 104, 22, 140,
    4, 98, 46, 112, 121, 148, 104, 24, 75, 7, 104, 25, 140, 1, 103, 148, 117, 101, 117,
    97, 117, 97, 140, 13, 100, 101, 118, 105, 99, 101, 95, 116, 114, 97, 99, 101, 115,
    148, 93, 148, 93, 148, 40, 125, 148, 40, 140, 6, 97, 99, 116, 105, 111, 110, 148,
    140, 13, 115, 101, 103, 109, 101, 110, 116, 95, 97, 108, 108, 111, 99, 148, 140, 4,
    97, 100, 100, 114, 148, 77, 0, 16, 104, 15, 74, 0, 0, 32, 0, 104, 7, 75, 0, 140, 7,
    116, 105, 109, 101, 95, 117, 115, 148, 75, 4, 104, 19, 93, 148, 117, 125, 148, 40,
    104, 34, 140, 5, 97, 108, 108, 111, 99, 148, 104, 36, 77, 0, 16, 104, 15, 75, 100,
    104, 7, 75, 0, 104, 37, 75, 5, 104, 19, 104, 20, 117, 125, 148, 40, 104, 34, 140, 3,
    111, 111, 109, 148, 140, 11, 100, 101, 118, 105, 99, 101, 95, 102, 114, 101, 101,
    148, 77, 0, 4, 104, 15, 74, 0, 0, 0, 64, 104, 7, 75, 0, 104, 37, 75, 6, 104, 19, 93,
    148, 117, 101, 97, 140, 18, 97, 108, 108, 111, 99, 97, 116, 111, 114, 95, 115, 101,
    116, 116, 105, 110, 103, 115, 148, 125, 148, 40, 140, 19, 101, 120, 112, 97, 110,
    100, 97, 98, 108, 101, 95, 115, 101, 103, 109, 101, 110, 116, 115, 148, 137, 140,
    14, 109, 97, 120, 95, 115, 112, 108, 105, 116, 95, 115, 105, 122, 101, 148, 74, 255,
    255, 255, 255, 117, 117, 46};

// Each test runs in a process of its own (ctest -j), all sharing TempDir():
// the file's name carries the test's name and the process id, or one test
// reads another's file.
std::string write_file(const std::string& name, const std::vector<unsigned char>& bytes) {
  const std::string path =
      ::testing::TempDir() +
      ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
      std::to_string(::getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(SnapshotReaderTest, ReadsTorchsFormat) {
  const Snapshot s = read_snapshot(write_file("snap.pickle", kSnapshot));
  ASSERT_TRUE(s.has_traces);
  ASSERT_EQ(s.traces.size(), 1u);
  const SnapshotTrace& t = s.traces[0];
  ASSERT_EQ(t.size_of(), 3u);
  EXPECT_EQ(t.action, (std::vector<uint8_t>{static_cast<uint8_t>(TraceAction::kSegmentAlloc),
                                            static_cast<uint8_t>(TraceAction::kAlloc),
                                            static_cast<uint8_t>(TraceAction::kOom)}));
  EXPECT_EQ(t.addr, (std::vector<uint64_t>{4096, 4096, 1024}));  // an oom's device_free
  EXPECT_EQ(t.size, (std::vector<int64_t>{2 << 20, 100, int64_t{1} << 30}));
  EXPECT_EQ(t.time_us, (std::vector<int64_t>{4, 5, 6}));
  const auto& stack = s.stacks.at(t.stack[1]);
  ASSERT_EQ(stack.size(), 2u);
  EXPECT_EQ(s.frames.at(stack[0]).filename, "a.py");
  EXPECT_EQ(s.frames.at(stack[1]).line, 7);
  EXPECT_EQ(s.frames.at(stack[1]).name, "g");
  EXPECT_EQ(t.stack[0], 0u);  // no frames: the empty stack
  ASSERT_EQ(s.segments.size(), 1u);
  EXPECT_EQ(s.segments[0].total_size, 2 << 20);
  EXPECT_EQ(s.segments[0].segment_type, "small");
  ASSERT_EQ(s.segments[0].blocks.size(), 1u);
  EXPECT_EQ(s.segments[0].blocks[0].requested_size, 100);
  EXPECT_EQ(s.segments[0].blocks[0].state, "active_allocated");
  EXPECT_EQ(s.segments[0].blocks[0].stack, t.stack[1]);  // one list, read once
  EXPECT_EQ(s.allocator_settings.at("expandable_segments"), "False");
  EXPECT_EQ(s.allocator_settings.at("max_split_size"), "-1");
}

TEST(SnapshotReaderTest, BadFilesAreOneLine) {
  auto why = [](const std::vector<unsigned char>& bytes) {
    try {
      read_snapshot(write_file("bad.pickle", bytes));
    } catch (const SnapshotFormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(why({}).find("not a torch memory snapshot (the file is empty)"), std::string::npos);
  EXPECT_NE(why({'h', 'i'}).find("not a pickle of protocol 2"), std::string::npos);
  std::vector<unsigned char> cut(kSnapshot.begin(), kSnapshot.end() - 20);
  EXPECT_NE(why(cut).find("ends in the middle"), std::string::npos);
  // A class (GLOBAL 'os system') is refused, never looked up.
  std::vector<unsigned char> global = {0x80, 2, 'c', 'o', 's', '\n', 's', 'y', 's', 't',
                                       'e', 'm', '\n', '.'};
  EXPECT_NE(why(global).find("pickle opcode 0x63"), std::string::npos);
  for (const auto& b : {std::vector<unsigned char>{}, global, cut}) {
    EXPECT_EQ(why(b).find('\n'), std::string::npos);
  }
}

std::string error_of(const std::vector<unsigned char>& bytes) {
  try {
    read_snapshot(write_file("hostile.pickle", bytes));
  } catch (const SnapshotFormatError& e) {
    return e.what();
  }
  return "no error";
}

TEST(SnapshotReaderTest, ALengthPastTheFilesEndIsRefusedBeforeAllocating) {
  // 11 bytes declaring a 4 GiB string (BINUNICODE8).
  std::vector<unsigned char> huge = {0x80, 4, 0x8d, 0, 0, 0, 0, 1, 0, 0, 0};
  EXPECT_NE(error_of(huge).find("ends in the middle of the pickle"), std::string::npos);
}

TEST(SnapshotReaderTest, AMemoSlotPastWhatTheFileStoredIsRefused) {
  // LONG_BINPUT a million slots ahead: 4 MB of memo for 5 bytes.
  std::vector<unsigned char> memo = {0x80, 4, ']', 'r', 0, 0, 16, 0, '.'};
  EXPECT_NE(error_of(memo).find("a memo index past the objects the file holds"),
            std::string::npos);
}

TEST(SnapshotReaderTest, ListsNestedAMillionDeepAreFreedWithoutRecursion) {
  // {"segments": [], "device_traces": [[{"action": "alloc", "extra": [[[...]]]}]]}:
  // the entry, made a row, freed its list once per level of recursion.
  std::vector<unsigned char> deep = {0x80, 4, '}', '('};
  auto str = [&](const std::string& k) {
    deep.push_back(0x8c);
    deep.push_back(static_cast<unsigned char>(k.size()));
    deep.insert(deep.end(), k.begin(), k.end());
  };
  str("segments");
  deep.push_back(']');
  str("device_traces");
  deep.insert(deep.end(), {']', ']', '}', '('});
  str("action");
  str("alloc");
  str("extra");
  const int depth = 1000000;
  deep.insert(deep.end(), depth, ']');
  deep.insert(deep.end(), depth - 1, 'a');
  deep.insert(deep.end(), {'u', 'a', 'a', 'u', '.'});
  const Snapshot s = read_snapshot(write_file("deep.pickle", deep));
  ASSERT_EQ(s.traces.size(), 1u);
  EXPECT_EQ(s.traces[0].size_of(), 1u);
}

TEST(SnapshotReaderTest, ASizeNoDeviceHoldsIsRefusedNamingTheEntry) {
  // A segment whose total_size is 2**62, as LONG1.
  std::vector<unsigned char> seg = {0x80, 4, '}', '(', 0x8c, 8, 's', 'e', 'g', 'm', 'e', 'n',
                                    't', 's', ']', '}', '(', 0x8c, 10, 't', 'o', 't', 'a', 'l',
                                    '_', 's', 'i', 'z', 'e', 0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x40,
                                    'u', 'a', 'u', '.'};
  EXPECT_NE(error_of(seg).find("a corrupted snapshot: segment 0 has total_size "
                               "4611686018427387904, outside 0..1125899906842624 bytes"),
            std::string::npos)
      << error_of(seg);
}

TEST(SnapshotReaderTest, AMissingFileIsARuntimeError) {
  EXPECT_THROW(read_snapshot(::testing::TempDir() + "no/such/file.pickle"), std::runtime_error);
}

}  // namespace
}  // namespace memfit
