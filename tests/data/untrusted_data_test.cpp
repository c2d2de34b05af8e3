// Image folders and tar shards from elsewhere (Note [Folders from
// elsewhere], Note [Shards from elsewhere], Note [Images from elsewhere]):
// what would hang, exhaust memory or pass for data is a clear DataError.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fulgor/data/image_folder.h"
#include "fulgor/data/tar_shards.h"
#include "../support/thrown.h"
#include "image_encode.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  explicit Scratch(const std::string& name)
      : root(fs::temp_directory_path() / fmt::format("fulgor_untrusted_{}_{}", name, ::getpid())) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~Scratch() { fs::remove_all(root); }
  fs::path root;
};

TEST(UntrustedImageFolder, AFifoOrADeviceNamedLikeAnImageIsNoImage) {
  Scratch dir("fifo");
  fs::create_directories(dir.root / "c");
  write_bytes((dir.root / "c" / "a.png").string(), encode_png(test_picture(4, 4, 3), 4, 4, 3));
  ASSERT_EQ(::mkfifo((dir.root / "c" / "x.jpg").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir.root / "c" / "zero.jpg");
  ImageFolder folder(dir.root.string());
  ASSERT_EQ(folder.size(), 1);
  EXPECT_EQ(folder.name(0), (dir.root / "c" / "a.png").string());
  // Read directly, neither blocks nor reads forever.
  std::vector<uint8_t> bytes;
  for (const char* name : {"x.jpg", "zero.jpg"}) {
    const std::string error = test::thrown_message<DataError>([&] { read_file((dir.root / "c" / name).string(), bytes); });
    EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
  }
}

TEST(UntrustedImageFolder, SymbolicLinkLoopsAreFoundNotWalked) {
  Scratch dir("loops");
  fs::create_directories(dir.root / "c" / "sub");
  write_bytes((dir.root / "c" / "a.png").string(), encode_png(test_picture(4, 4, 3), 4, 4, 3));
  fs::create_symlink("self.jpg", dir.root / "c" / "self.jpg");  // links to themselves: no images
  fs::create_symlink("other.jpg", dir.root / "c" / "other.jpg");
  EXPECT_EQ(ImageFolder(dir.root.string()).size(), 1);
  fs::create_symlink("..", dir.root / "c" / "sub" / "up");
  const std::string error = test::thrown_message<DataError>([&] { ImageFolder folder(dir.root.string()); });
  EXPECT_NE(error.find("'" + (dir.root / "c" / "sub" / "up").string() + "' leads back to a folder above it"),
            std::string::npos)
      << error;
}

// A PNG whose header declares `width` x `height` (its CRC fixed).
constexpr uint8_t kFrameHeader[] = {0xFF, 0xC0};  // SOF0, a baseline JPEG's

std::vector<uint8_t> png_declaring(uint32_t width, uint32_t height) {
  std::vector<uint8_t> png = encode_png(test_picture(4, 4, 3), 4, 4, 3);
  for (int i = 0; i < 4; ++i) {
    png[16 + i] = static_cast<uint8_t>(width >> (24 - 8 * i));
    png[20 + i] = static_cast<uint8_t>(height >> (24 - 8 * i));
  }
  const uLong crc = crc32(0, png.data() + 12, 17);
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  return png;
}

TEST(UntrustedImage, APixelBombIsRefusedFromItsHeader) {
  ImageDecoder decoder;
  for (auto [w, h] : {std::pair<uint32_t, uint32_t>{65535, 21845}, {60000, 60000}}) {
    const auto png = png_declaring(w, h);
    const std::string error = test::thrown_message<DataError>([&] { decoder.header(png.data(), png.size(), "bomb.png"); });
    EXPECT_NE(error.find(fmt::format("bomb.png: declares {} x {}", w, h)), std::string::npos) << error;
    EXPECT_NE(error.find("the limit of 178956970"), std::string::npos) << error;
    DecodedImage image;
    EXPECT_THROW(decoder.decode(png.data(), png.size(), "bomb.png", {}, image), DataError);
    EXPECT_TRUE(image.pixels.empty());
  }
  // The limit is the caller's to choose.
  const auto small = png_declaring(4, 4);
  EXPECT_EQ(ImageDecoder(16).header(small.data(), small.size(), "ok.png").width, 4);
  EXPECT_THROW(ImageDecoder(15).header(small.data(), small.size(), "big.png"), DataError);
}

TEST(UntrustedImage, AJpegEndingBeforeItsFrameHeaderHasNoSize) {
  const auto jpeg = encode_jpeg(test_picture(16, 16, 3), 16, 16, 3);
  const auto frame = std::search(jpeg.begin(), jpeg.end(), kFrameHeader, kFrameHeader + 2);
  ASSERT_NE(frame, jpeg.end());
  std::vector<uint8_t> cut(jpeg.begin(), frame), tables_only = cut;
  tables_only.insert(tables_only.end(), {0xFF, 0xD9});
  ImageDecoder decoder;
  for (const auto& bytes : {cut, tables_only, std::vector<uint8_t>{0xFF, 0xD8, 0xFF}}) {
    const std::string error = test::thrown_message<DataError>([&] { decoder.header(bytes.data(), bytes.size(), "cut.jpg"); });
    EXPECT_NE(error.find("cut.jpg: not a valid JPEG image (it ends before its frame header and size)"), std::string::npos)
        << error;
  }
}

// A ustar header (TarShards reads the name, size, type and magic).
std::string tar_header(const std::string& name, uint64_t size, char type = '0') {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), name.size());
  const std::string octal = fmt::format("{:011o}", size);
  if (octal.size() == 11) {
    std::memcpy(h.data() + 124, octal.data(), 11);
  } else {  // base-256
    h[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>(size >> (8 * i));
  }
  h[156] = type;
  std::memcpy(h.data() + 257, "ustar", 5);
  return h;
}

std::string member(const std::string& name, const std::string& data, char type = '0') {
  std::string out = tar_header(name, data.size(), type) + data;
  out.append((512 - data.size() % 512) % 512, '\0');
  return out;
}

fs::path write_tar(const fs::path& path, const std::string& members) {
  std::ofstream(path, std::ios::binary) << members << std::string(1024, '\0');
  return path;
}

std::string shard_error(const fs::path& tar) {
  return test::thrown_message<DataError>([&] { TarShards shards({tar.string()}, false); });
}

TEST(UntrustedTarShards, ClassIndicesOutOfRangeAreRefused) {
  Scratch dir("cls");
  const std::string image = member("s.png", "not decoded while indexing");
  for (const std::string cls : {"9223372036854775807", "12345678901234567890123", "1000000", "-1", "1x"}) {
    const fs::path tar = write_tar(dir.root / "s.tar", image + member("s.cls", cls + "\n"));
    const std::string error = shard_error(tar);
    EXPECT_NE(error.find("not a class index (an integer from 0 to 999999)"), std::string::npos) << error;
  }
  EXPECT_EQ(TarShards({write_tar(dir.root / "ok.tar", image + member("s.cls", "999999\n")).string()}, false).size(), 1);
}

TEST(UntrustedTarShards, DeclaredSizesAreCheckedBeforeAnythingIsRead) {
  Scratch dir("sizes");
  const auto start = std::chrono::steady_clock::now();
  std::string pax = "18446744073709551615 path=x\n";
  const std::string error = shard_error(write_tar(dir.root / "pax.tar", member("p", pax, 'x')));
  EXPECT_NE(error, "no error");  // the pax record is skipped; the shard then holds no samples
  EXPECT_NE(error.find("hold no samples"), std::string::npos) << error;
  const fs::path huge = write_tar(dir.root / "huge.tar", tar_header("s.cls", ~uint64_t{0}));
  EXPECT_NE(shard_error(huge).find("is truncated"), std::string::npos) << shard_error(huge);
  const fs::path big_cls = write_tar(dir.root / "big.tar", member("s.cls", std::string(2 << 20, '1')));
  EXPECT_NE(shard_error(big_cls).find("fulgor reads names and class indices of up to 1048576 bytes"),
            std::string::npos)
      << shard_error(big_cls);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Note [Tar numbers]: what is not one is not read as another size.
TEST(UntrustedTarShards, SizeFieldsThatAreNoTarNumberAreRefused) {
  Scratch dir("size_fields");
  const std::string png = "png bytes, not decoded while indexing", cls = member("s.cls", "3\n");
  auto with_size_field = [&](const std::string& field) {
    std::string image = member("s.png", png);
    image.replace(124, 12, field);
    return write_tar(dir.root / "s.tar", image + cls);
  };
  const std::string wraps = std::string("\x80\x01", 2) + std::string(8, '\0') + '\0' + static_cast<char>(png.size());
  for (const std::string& field :
       {std::string("-0000000001\0", 12), std::string("0000000009x\0", 12), wraps, std::string(12, '\xff')}) {
    const std::string error = shard_error(with_size_field(field));
    EXPECT_NE(error.find("member 's.png' (header at byte 0) has the size field"), std::string::npos) << error;
    EXPECT_NE(error.find("not a tar number"), std::string::npos) << error;
  }
  // Spaces around the digits, and base-256 below 2^64, are numbers.
  const std::string octal = fmt::format("  {:o} ", png.size());
  const std::string base256 = std::string(1, '\x80') + std::string(10, '\0') + static_cast<char>(png.size());
  for (const std::string& field : {octal + std::string(12 - octal.size(), '\0'), base256}) {
    TarShards shards({with_size_field(field).string()}, false);
    std::vector<uint8_t> bytes;
    shards.read(0, bytes);
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), png);
  }
}

// A member named ".png" has the key "" (WebDataset's): it is no part of the
// sample that follows.
TEST(UntrustedTarShards, AnEmptyKeyIsASampleOfItsOwn) {
  Scratch dir("empty_key");
  const std::string error = shard_error(write_tar(dir.root / "s.tar", member(".png", "x") + member("t.cls", "2\n")));
  EXPECT_NE(error.find("sample '' has no .cls member"), std::string::npos) << error;
}

TEST(UntrustedTarShards, AnIndexThatIsNoRegularFileOrTooLargeIsRefused) {
  Scratch dir("index_files");
  const fs::path tar = write_tar(dir.root / "s.tar", member("s.png", "x") + member("s.cls", "3\n"));
  const fs::path index = tar.string() + ".idx";
  auto index_error = [&] { return test::thrown_message<DataError>([&] { TarShards shards({tar.string()}); }); };
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  EXPECT_NE(index_error().find("s.tar.idx' is a FIFO, not a regular file"), std::string::npos) << index_error();
  fs::remove(index);
  fs::create_symlink("/dev/zero", index);
  EXPECT_NE(index_error().find("s.tar.idx' is a character device, not a regular file"), std::string::npos)
      << index_error();
  fs::remove(index);
  std::ofstream(index) << std::string(fs::file_size(tar) + 5000, ' ');
  EXPECT_NE(index_error().find("more than its shard's"), std::string::npos) << index_error();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(UntrustedTarShards, AnEmptyShardIsAnErrorNotZeroSamples) {
  Scratch dir("empty");
  const std::string error = shard_error(write_tar(dir.root / "empty.tar", ""));
  EXPECT_NE(error.find("hold no samples"), std::string::npos) << error;
}

TEST(UntrustedTarShards, AFifoIsNoShard) {
  Scratch dir("fifo_shard");
  ASSERT_EQ(::mkfifo((dir.root / "x.tar").c_str(), 0600), 0);
  EXPECT_NE(shard_error(dir.root / "x.tar").find("x.tar' is a FIFO, not a regular file"), std::string::npos)
      << shard_error(dir.root / "x.tar");
}

TEST(UntrustedTarShards, AnIndexOutOfRangeIsRefused) {
  Scratch dir("index");
  const fs::path tar =
      write_tar(dir.root / "s.tar", member("s.png", "x") + member("s.cls", "3\n"));
  const uint64_t size = fs::file_size(tar);
  for (const std::string line : {"512 1 999999999999 s.png", "18446744073709551615 2 3 s.png", "512 18446744073709551615 3 s.png"}) {
    std::ofstream(tar.string() + ".idx") << fmt::format("fulgor-tar-index 1 {} 1\n{}\n", size, line);
    const std::string error = test::thrown_message<DataError>([&] { TarShards shards({tar.string()}); });
    EXPECT_NE(error.find("not 'OFFSET SIZE CLASS MEMBER'"), std::string::npos) << line << ": " << error;
  }
}

}  // namespace
}  // namespace fulgor::testing
