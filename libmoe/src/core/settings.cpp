// The table of settings and flags (see moe/settings.h).
#include "moe/settings.h"

namespace moe {

const char* flag_for(Setting setting) {
  switch (setting) {
#define MOE_SETTING_CASE(name, flag) \
  case Setting::name:                \
    return flag;
    MOE_SETTINGS(MOE_SETTING_CASE)
#undef MOE_SETTING_CASE
  }
  return "?";
}

}  // namespace moe
