// fmt's out-of-line definitions, compiled into a program that links them in instead of loading
// libfmt.so (launcher/meson.build says which and why). They come from the installed fmt's own
// format-inl.h, so they match the headers every other object was compiled against.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
// format.h declares these two templates without a body for char; libfmt instantiates them.
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE
