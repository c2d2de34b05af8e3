# Makes, from the plugin of docs/accelerators.md, what a vendor of a machine
# with two devices would: device_count() 2 and a priority above the built-ins,
# under another name; nothing else changes. -DINPUT=source -DOUTPUT=source
file(READ "${INPUT}" source)
foreach(pair
    "return -5;|return 500;"
    "return is_available() ? 1 : 0;|return is_available() ? 2 : 0;"
    "REGISTER_ACCELERATOR(\"mycpu\"|REGISTER_ACCELERATOR(\"twocpu\"")
  string(FIND "${pair}" "|" bar)
  string(SUBSTRING "${pair}" 0 ${bar} from)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${pair}" ${after} -1 to)
  string(FIND "${source}" "${from}" found)
  if(found EQUAL -1)
    message(FATAL_ERROR "the plugin of docs/accelerators.md no longer has '${from}'")
  endif()
  string(REPLACE "${from}" "${to}" source "${source}")
endforeach()
file(WRITE "${OUTPUT}" "${source}")
