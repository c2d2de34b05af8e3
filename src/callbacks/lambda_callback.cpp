#include "fulgor/callbacks/lambda_callback.h"

namespace fulgor {

#define FULGOR_HOOK(name) \
  void LambdaCallback::name(Trainer& trainer, ModuleBase& module) {  \
    if (hooks_.name) hooks_.name(trainer, module);                     \
  }
#define FULGOR_HOOK_WITH(name, Type)                                          \
  void LambdaCallback::name(Trainer& trainer, ModuleBase& module, Type arg) { \
    if (hooks_.name) hooks_.name(trainer, module, arg);                       \
  }
#define FULGOR_BATCH_END(name, types, from_end)                                               \
  void LambdaCallback::name(Trainer& trainer, ModuleBase& module, const BatchEnd& end) { \
    if (hooks_.name) hooks_.name(trainer, module, end);                                    \
  }
#include "fulgor/callback_hooks.def"

}  // namespace fulgor
