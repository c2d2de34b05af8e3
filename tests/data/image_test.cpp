// Decoding (TurboJPEG, libpng), torchvision's transforms, ImageFolder.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fulgor/data/image_decode.h"
#include "fulgor/data/image_folder.h"
#include "fulgor/data/image_transforms.h"
#include "image_encode.h"

namespace fulgor::testing {
namespace {

namespace fs = std::filesystem;

struct ImageTempDir {
  ImageTempDir() {
    path = fs::temp_directory_path() / ("fulgor_image_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~ImageTempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const {
    fs::create_directories((path / name).parent_path());
    return (path / name).string();
  }
  fs::path path;
};

torch::Tensor hwc(const std::vector<uint8_t>& pixels, int64_t w, int64_t h, int64_t c) {
  return torch::from_blob(const_cast<uint8_t*>(pixels.data()), {h, w, c}, torch::kUInt8).clone();
}

TEST(ImageDecode, PngIsLosslessInRgbAndGray) {
  ImageDecoder decoder;
  for (int channels : {1, 3}) {
    const auto pixels = test_picture(40, 30, channels);
    const auto png = encode_png(pixels, 40, 30, channels);
    const ImageHeader head = decoder.header(png.data(), png.size(), "x.png");
    EXPECT_EQ(head.format, ImageFormat::png);
    EXPECT_EQ(head.width, 40);
    EXPECT_EQ(head.height, 30);
    DecodedImage image;
    decoder.decode(png.data(), png.size(), "x.png", {channels}, image);
    EXPECT_EQ(image.channels, channels);
    EXPECT_EQ(image.pixels, pixels) << channels << " channels";
  }
}

TEST(ImageDecode, JpegDecodesCloseToWhatWasEncoded) {
  ImageDecoder decoder;
  const auto pixels = test_picture(64, 48, 3);
  const auto jpeg = encode_jpeg(pixels, 64, 48, 3, 100, TJSAMP_444);
  DecodedImage image;
  decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", {3}, image);
  ASSERT_EQ(image.width, 64);
  ASSERT_EQ(image.height, 48);
  EXPECT_DOUBLE_EQ(image.scale, 1.0);
  const auto diff = (hwc(image.pixels, 64, 48, 3).to(torch::kInt) - hwc(pixels, 64, 48, 3).to(torch::kInt)).abs();
  EXPECT_LT(diff.to(torch::kFloat).mean().item<float>(), 1.0f);
  // Gray from a colour JPEG: its luma.
  decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", {1}, image);
  EXPECT_EQ(image.channels, 1);
  EXPECT_EQ(image.pixels.size(), 64u * 48u);
}

// Note [Decoding at a smaller scale]: 1/4 keeps a 64 x 48 region at least 16 x 12.
TEST(ImageDecode, JpegScalesInTheDctWhenTheOutputIsMuchSmaller) {
  ImageDecoder decoder;
  const auto jpeg = encode_jpeg(test_picture(64, 48, 3), 64, 48, 3);
  DecodedImage image;
  decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", {3, 64, 48, 16, 12}, image);
  EXPECT_EQ(image.width, 16);
  EXPECT_EQ(image.height, 12);
  EXPECT_DOUBLE_EQ(image.scale, 0.25);
  decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", {3, 32, 24, 16, 12}, image);
  EXPECT_DOUBLE_EQ(image.scale, 0.5) << "a half-size region halves at most";
  decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", {3, 64, 48, 60, 12}, image);
  EXPECT_DOUBLE_EQ(image.scale, 1.0) << "wider than any smaller scale keeps";
}

// Note [Decoding only the crop]: the output from the cut-out blocks is the
// output from the whole decoded image, for every subsampling's MCU grid, for
// random crops (shrunk and enlarged) and center crops, in RGB and gray.
TEST(ImageDecode, JpegCropInTheDctGivesWhatDecodingAllThenCroppingGives) {
  ImageDecoder decoder;
  const int width = 203, height = 157;  // not multiples of any MCU
  const ImageTransforms random({RandomResizedCrop{{40}, {0.01, 0.2}}, RandomHorizontalFlip{}}, {3, torch::kFloat});
  const ImageTransforms center({Resize{{300}}, CenterCrop{{48, 64}}}, {3, torch::kFloat});
  const ImageTransforms gray({RandomResizedCrop{{30, 36}, {0.02, 0.2}}}, {1, torch::kByte});
  DecodedImage cut, whole;
  int64_t cuts = 0;
  for (int subsampling : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440, TJSAMP_411}) {
    const auto jpeg = encode_jpeg(test_picture(width, height, 3, subsampling), width, height, 3, 90, subsampling);
    for (const ImageTransforms* t : {&random, &center, &gray})
      for (int64_t i = 0; i < 40; ++i) {
        const ImageCrop crop = t->plan(width, height, 7, 0, i);
        DecodeRequest request = t->request(crop);
        decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", request, cut);
        request.crop = false;
        decoder.decode(jpeg.data(), jpeg.size(), "x.jpg", request, whole);
        ASSERT_EQ(cut.scale, whole.scale);
        cuts += cut.width < whole.width || cut.height < whole.height;
        const auto a = (*t)(cut, crop).to(torch::kFloat), b = (*t)(whole, crop).to(torch::kFloat);
        // Tolerance: float rounding of the same sums (1e-4 of the 0..1 range), none in uint8.
        const float tolerance = t->dtype() == torch::kByte ? 0.0f : 1e-4f;
        ASSERT_LE((a - b).abs().max().item<float>(), tolerance)
            << "subsampling " << subsampling << ", sample " << i << ": crop " << crop.x << "," << crop.y << " "
            << crop.width << "x" << crop.height << ", decoded part " << cut.x << "," << cut.y << " " << cut.width << "x"
            << cut.height << " at scale " << cut.scale;
      }
  }
  EXPECT_GT(cuts, 300) << "the small crops were decoded whole";
}

TEST(ImageDecode, CorruptTruncatedAndForeignDataAreErrorsNamingTheSample) {
  ImageDecoder decoder;
  auto jpeg = encode_jpeg(test_picture(64, 48, 3), 64, 48, 3);
  jpeg.resize(jpeg.size() / 2);
  DecodedImage image;
  try {
    decoder.decode(jpeg.data(), jpeg.size(), "cut.jpg", {3}, image);
    FAIL() << "a truncated JPEG decoded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jpg: corrupt or truncated JPEG"), std::string::npos) << e.what();
  }
  auto png = encode_png(test_picture(40, 30, 3), 40, 30, 3);
  png.resize(png.size() - 20);
  EXPECT_THROW(decoder.decode(png.data(), png.size(), "cut.png", {3}, image), DataError);
  // Truncated where only a crop of it is asked for.
  DecodeRequest corner{3, 8, 8, 8, 8, 48, 36};
  EXPECT_THROW(decoder.decode(jpeg.data(), jpeg.size(), "cut.jpg", corner, image), DataError);
  const std::vector<uint8_t> text{'h', 'e', 'l', 'l', 'o'};
  try {
    decoder.decode(text.data(), text.size(), "notes.jpg", {3}, image);
    FAIL() << "text decoded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("notes.jpg: not a JPEG or PNG image"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decoder.decode(png.data(), png.size(), "x.png", {2}, image), ConfigError);
}

DecodedImage random_image(int64_t w, int64_t h, int64_t c) {
  DecodedImage image{w, h, c, 1.0, {}, 0, 0};
  auto t = torch::randint(0, 256, {h, w, c}, torch::kUInt8);
  image.pixels.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  return image;
}

// The resampling is PyTorch's antialiased bilinear interpolation, which
// torchvision's Resize(antialias=True) runs.
TEST(ImageTransforms, ResizeIsLibTorchsAntialiasedBilinear) {
  torch::manual_seed(3);
  const auto image = random_image(37, 29, 3);
  const auto source = hwc(image.pixels, 37, 29, 3).permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat);
  for (std::vector<int64_t> size : {std::vector<int64_t>{15, 20}, std::vector<int64_t>{40, 50}}) {
    ImageTransforms resize({Resize{size}});
    const auto out = resize(image, resize.plan(37, 29, 0, 0, 0));
    namespace F = torch::nn::functional;
    const auto expected = F::interpolate(source, F::InterpolateFuncOptions()
                                                     .size(std::vector<int64_t>{size[0], size[1]})
                                                     .mode(torch::kBilinear)
                                                     .align_corners(false)
                                                     .antialias(true))
                              .squeeze(0) /
                          255.0;
    EXPECT_TRUE(torch::allclose(out, expected, 1e-4, 1e-4))
        << "size " << size[0] << "x" << size[1] << ": " << (out - expected).abs().max().item<float>();
  }
}

// torchvision: Resize(256) of 500 x 375 is 341 x 256; CenterCrop(224) of it
// starts at round(58.5) = 58 (Python's round) and round(16) = 16.
TEST(ImageTransforms, ResizeAndCenterCropFollowTorchvisionsSizes) {
  ImageTransforms t({Resize{{256}}, CenterCrop{{224}}});
  EXPECT_EQ(t.width(), 224);
  EXPECT_EQ(t.height(), 224);
  const ImageCrop crop = t.plan(500, 375, 0, 0, 0);
  EXPECT_NEAR(crop.x, 58 * 500.0 / 341, 1e-9);
  EXPECT_NEAR(crop.y, 16 * 375.0 / 256, 1e-9);
  EXPECT_NEAR(crop.width, 224 * 500.0 / 341, 1e-9);
  // A crop larger than the image pads: the image sits at (crop - image) // 2.
  ImageTransforms pad({CenterCrop{{10, 12}}}, {3, torch::kByte});
  DecodedImage image{8, 6, 3, 1.0, test_picture(8, 6, 3), 0, 0};
  const auto out = pad(image, pad.plan(8, 6, 0, 0, 0));
  EXPECT_TRUE(torch::equal(out.narrow(1, 2, 6).narrow(2, 2, 8), hwc(image.pixels, 8, 6, 3).permute({2, 0, 1})));
  EXPECT_EQ(out.narrow(1, 0, 2).sum().item<int64_t>(), 0);
}

TEST(ImageTransforms, RandomChoicesDependOnSeedEpochAndIndexOnly) {
  ImageTransforms t({RandomResizedCrop{{32}}, RandomHorizontalFlip{}});
  int flips = 0, moved = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const ImageCrop c = t.plan(500, 375, 7, 2, i);
    const ImageCrop again = t.plan(500, 375, 7, 2, i);
    EXPECT_EQ(c.x, again.x);
    EXPECT_EQ(c.flip, again.flip);
    EXPECT_GE(c.x, 0);
    EXPECT_GE(c.y, 0);
    EXPECT_LE(c.x + c.width, 500 + 1e-9);
    EXPECT_LE(c.y + c.height, 375 + 1e-9);
    const double area = c.width * c.height / (500.0 * 375.0), ratio = c.width / c.height;
    EXPECT_GE(area, 0.08 * 0.9);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.1);
    EXPECT_GE(ratio, 3.0 / 4.0 / 1.1);
    flips += c.flip;
    const ImageCrop other = t.plan(500, 375, 7, 3, i);
    moved += other.x != c.x || other.y != c.y || other.width != c.width;
  }
  EXPECT_GT(moved, 190) << "another epoch, other crops";
  EXPECT_GT(flips, 70);
  EXPECT_LT(flips, 130);
}

TEST(ImageTransforms, FlipAndNormalizeAsTorchvision) {
  DecodedImage image{8, 6, 3, 1.0, test_picture(8, 6, 3), 0, 0};
  ImageTransforms plain({CenterCrop{{6, 8}}});
  ImageTransforms flipped(
      {CenterCrop{{6, 8}}, RandomHorizontalFlip{1.0}, Normalize{{0.5, 0.4, 0.3}, {0.2, 0.25, 0.5}}});
  const auto a = plain(image, plain.plan(8, 6, 0, 0, 0));
  EXPECT_TRUE(torch::allclose(a, hwc(image.pixels, 8, 6, 3).permute({2, 0, 1}).to(torch::kFloat) / 255.0));
  const auto b = flipped(image, flipped.plan(8, 6, 0, 0, 0));
  const auto mean = torch::tensor({0.5, 0.4, 0.3}).view({3, 1, 1}),
             std = torch::tensor({0.2, 0.25, 0.5}).view({3, 1, 1});
  EXPECT_TRUE(torch::allclose(b, (a.flip({2}) - mean) / std, 1e-5, 1e-5));
}

TEST(ImageTransforms, RejectsWhatABatchCannotHold) {
  EXPECT_THROW(ImageTransforms({Resize{{256}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{0}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{1, 2, 3}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{8}}, Normalize{{0.5}, {0.5}}}, {3, torch::kByte}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{8}}, Normalize{{0.5, 0.5}, {0.5}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({Normalize{{0.5}, {0.5}}, CenterCrop{{8}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({RandomResizedCrop{{8}, {0.5, 0.1}}}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{8}}, RandomHorizontalFlip{1.5}}), ConfigError);
  EXPECT_THROW(ImageTransforms({CenterCrop{{8}}}, {2}), ConfigError);
}

// torchvision's find_classes and make_dataset: sorted class folders, each
// one's files found under it in sorted order, by extension in any case.
TEST(ImageFolder, FindsClassesAndFilesInTorchvisionsOrder) {
  ImageTempDir dir;
  const auto png = encode_png(test_picture(4, 4, 3), 4, 4, 3);
  for (const char* name :
       {"dog/b.png", "dog/a.PNG", "dog/z/c.jpg", "dog/notes.txt", "cat/x.jpeg", "cat/y.bmp", "ant/1.png"})
    write_bytes(dir.file(name), png);
  ImageFolder folder(dir.path.string());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"ant", "cat", "dog"}));
  ASSERT_EQ(folder.size(), 6);
  const std::string root = dir.path.string();
  std::vector<std::string> names;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < folder.size(); ++i) {
    names.push_back(folder.name(i).substr(root.size() + 1));
    targets.push_back(folder.target(i));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ant/1.png", "cat/x.jpeg", "cat/y.bmp", "dog/a.PNG", "dog/b.png",
                                             "dog/z/c.jpg"}));
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 1, 2, 2, 2}));
  std::vector<uint8_t> bytes;
  folder.read(4, bytes);
  EXPECT_EQ(bytes, png);
}

TEST(ImageFolder, SaysWhatIsMissing) {
  ImageTempDir dir;
  auto error_of = [](const std::string& root) {
    try {
      ImageFolder folder(root);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of((dir.path / "absent").string()).find("is not a folder"), std::string::npos);
  write_bytes(dir.file("loose.png"), {1, 2});
  EXPECT_NE(error_of(dir.path.string()).find("couldn't find any class folder"), std::string::npos);
  write_bytes(dir.file("full/a.png"), {1, 2});
  write_bytes(dir.file("texts/a.txt"), {1, 2});
  fs::create_directories(dir.path / "void");
  const std::string message = error_of(dir.path.string());
  EXPECT_NE(message.find("found no valid file for the classes texts, void"), std::string::npos) << message;
  EXPECT_NE(message.find(".jpg, .jpeg, .png"), std::string::npos) << message;
}

}  // namespace
}  // namespace fulgor::testing
