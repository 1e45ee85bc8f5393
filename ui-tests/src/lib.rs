//! trybuild and macrotest cases for idem's macros; see tests/.
