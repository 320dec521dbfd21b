#include "common/byte_size.h"

#include "gtest/gtest.h"

namespace summa {
namespace {

TEST(ByteSizeTest, ParsesSizesWithBinarySuffixes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("4K"), 4096);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096);
  EXPECT_EQ(*ParseByteSize("64kb"), 64 << 10);
  EXPECT_EQ(*ParseByteSize(" 256MiB "), int64_t{256} << 20);
  EXPECT_EQ(*ParseByteSize("1G"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("1GiB"), int64_t{1} << 30);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("4X").ok());
  EXPECT_FALSE(ParseByteSize("-4K").ok());
  EXPECT_FALSE(ParseByteSize("1.5G").ok());
  EXPECT_FALSE(ParseByteSize("99999999999G").ok());
}

TEST(ByteSizeTest, FormatsSizesExactly) {
  EXPECT_EQ(FormatByteSize(4096), "4KiB");
  EXPECT_EQ(FormatByteSize(int64_t{256} << 20), "256MiB");
  EXPECT_EQ(FormatByteSize(int64_t{1} << 30), "1GiB");
  EXPECT_EQ(FormatByteSize(1536 << 10), "1536KiB");
  EXPECT_EQ(FormatByteSize(1000), "1000B");
}

}  // namespace
}  // namespace summa
