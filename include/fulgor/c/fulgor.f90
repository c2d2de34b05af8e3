! Fortran bindings of fulgor's C API (include/fulgor/c/fulgor.h), through
! iso_c_binding. Arrays are passed with their shape reversed: a Fortran
! array x(features, rows) is, in memory, the C array x[rows][features].
!
! Installed as source: a compiled module (.mod) is specific to the compiler
! and its version, so each program compiles this file with its own compiler
! (CMake: find_package(fulgor COMPONENTS Fortran) and link fulgor::fortran).
module fulgor
  use iso_c_binding
  implicit none
  private
  public :: fulgor_model_create, fulgor_model_create_from_file, fulgor_model_destroy, fulgor_train, &
            fulgor_predict, fulgor_train_multiarg, fulgor_predict_multiarg, fulgor_save, fulgor_load, &
            fulgor_model_rank, fulgor_error, c_string

  ! One of several buffers (fulgor_train_multiarg, fulgor_predict_multiarg):
  ! data = c_loc(array), shape = c_loc of an integer(c_int64_t) array holding
  ! the array's shape reversed, rank = its length.
  type, bind(c), public :: fulgor_tensor
    type(c_ptr) :: data
    integer(c_int) :: dtype
    type(c_ptr) :: shape
    integer(c_int32_t) :: rank
  end type

  integer(c_int), parameter, public :: FULGOR_OK = 0, FULGOR_ERROR_ARGUMENT = 1, FULGOR_ERROR_CONFIG = 2, &
                                       FULGOR_ERROR_MODEL = 3, FULGOR_ERROR_SHAPE = 4, &
                                       FULGOR_ERROR_CHECKPOINT = 5, FULGOR_ERROR_DEVICE = 6, &
                                       FULGOR_ERROR_INTERNAL = 7
  integer(c_int), parameter, public :: FULGOR_FLOAT32 = 0, FULGOR_FLOAT64 = 1, FULGOR_INT32 = 2, FULGOR_INT64 = 3

  interface
    function fulgor_model_create(path, config, model) result(status) bind(c, name="fulgor_model_create")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: path, config
      type(c_ptr), intent(out) :: model
      integer(c_int) :: status
    end function

    function fulgor_model_create_from_file(path, config_path, model) result(status) &
        bind(c, name="fulgor_model_create_from_file")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: path, config_path
      type(c_ptr), intent(out) :: model
      integer(c_int) :: status
    end function

    subroutine fulgor_model_destroy(model) bind(c, name="fulgor_model_destroy")
      import :: c_ptr
      type(c_ptr), value :: model
    end subroutine

    function fulgor_train(model, input, input_dtype, input_shape, input_rank, label, label_dtype, label_shape, &
                          label_rank, loss) result(status) bind(c, name="fulgor_train")
      import :: c_int, c_int32_t, c_int64_t, c_double, c_ptr
      type(c_ptr), value :: model, input, label
      integer(c_int), value :: input_dtype, label_dtype
      integer(c_int64_t), dimension(*), intent(in) :: input_shape, label_shape
      integer(c_int32_t), value :: input_rank, label_rank
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function

    function fulgor_predict(model, input, input_dtype, input_shape, input_rank, output, output_dtype, &
                            output_shape, output_rank) result(status) bind(c, name="fulgor_predict")
      import :: c_int, c_int32_t, c_int64_t, c_ptr
      type(c_ptr), value :: model, input, output
      integer(c_int), value :: input_dtype, output_dtype
      integer(c_int64_t), dimension(*), intent(in) :: input_shape, output_shape
      integer(c_int32_t), value :: input_rank, output_rank
      integer(c_int) :: status
    end function

    function fulgor_train_multiarg(model, inputs, n_inputs, labels, n_labels, loss) result(status) &
        bind(c, name="fulgor_train_multiarg")
      import :: c_int, c_int32_t, c_double, c_ptr, fulgor_tensor
      type(c_ptr), value :: model
      type(fulgor_tensor), dimension(*), intent(in) :: inputs, labels
      integer(c_int32_t), value :: n_inputs, n_labels
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function

    function fulgor_predict_multiarg(model, inputs, n_inputs, outputs, n_outputs) result(status) &
        bind(c, name="fulgor_predict_multiarg")
      import :: c_int, c_int32_t, c_ptr, fulgor_tensor
      type(c_ptr), value :: model
      type(fulgor_tensor), dimension(*), intent(in) :: inputs, outputs
      integer(c_int32_t), value :: n_inputs, n_outputs
      integer(c_int) :: status
    end function

    function fulgor_save(model, path) result(status) bind(c, name="fulgor_save")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function

    function fulgor_load(model, path) result(status) bind(c, name="fulgor_load")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function

    function fulgor_model_rank(model, rank, world_size) result(status) bind(c, name="fulgor_model_rank")
      import :: c_int, c_int64_t, c_ptr
      type(c_ptr), value :: model
      integer(c_int64_t), intent(out) :: rank, world_size
      integer(c_int) :: status
    end function

    function fulgor_last_error() result(message) bind(c, name="fulgor_last_error")
      import :: c_ptr
      type(c_ptr) :: message
    end function

    function c_strlen(s) result(length) bind(c, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: length
    end function
  end interface

contains

  ! A Fortran string as C takes it: trimmed, NUL-terminated.
  function c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=len_trim(s) + 1) :: c
    c = trim(s) // c_null_char
  end function

  ! What the last failed call said.
  function fulgor_error() result(message)
    character(len=:), allocatable :: message
    character(kind=c_char), pointer :: chars(:)
    type(c_ptr) :: text
    integer :: i, n
    text = fulgor_last_error()
    n = int(c_strlen(text))
    call c_f_pointer(text, chars, [n])
    allocate(character(len=n) :: message)
    do i = 1, n
      message(i:i) = chars(i)
    end do
  end function
end module fulgor
