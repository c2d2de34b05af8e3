! A simulation's time loop training a model defined in Python: each step
! makes a batch of samples and trains on it through fulgor's C API.
!
!   fortran_train MODEL.pt [CHECKPOINT]
!
! MODEL.pt: a TorchScript network of 4 inputs and 1 output, as make_model
! (C++) or make_model.py (Python) in this folder write it. Exits 2 after its
! usage without a model, 1 when a call fails or the loss does not fall.
program train
  use iso_c_binding
  use iso_fortran_env, only: error_unit
  use fulgor
  implicit none
  integer, parameter :: rows = 32, features = 4, steps = 200
  real(c_float), target :: x(features, rows), y(1, rows), predicted(1, rows)
  integer(c_int64_t) :: x_shape(2), y_shape(2)
  type(c_ptr) :: model
  real(c_double) :: loss, first
  character(len=4096) :: path, checkpoint
  integer :: i, j, step

  if (command_argument_count() < 1) then
    write (error_unit, '(a)') "usage: fortran_train MODEL.pt [CHECKPOINT]"
    stop 2
  end if
  call get_command_argument(1, path)
  checkpoint = "fortran_train.ckpt"
  if (command_argument_count() > 1) call get_command_argument(2, checkpoint)

  call expect(fulgor_model_create(c_string(path), c_string( &
      '{"accelerator": "cpu", "loss": "mse", "seed": 1, "optimizer": {"type": "adam", "lr": 0.01}}'), model))
  x_shape = [int(rows, c_int64_t), int(features, c_int64_t)]   ! reversed: C's [rows][features]
  y_shape = [int(rows, c_int64_t), 1_c_int64_t]

  do step = 1, steps
    ! The simulation's state at this step, and the quantity to learn from it.
    do i = 1, rows
      do j = 1, features
        x(j, i) = sin(0.05 * step + 0.7 * i + 1.3 * j)
      end do
      y(1, i) = x(1, i) - 2 * x(2, i) + 0.5 * x(3, i)
    end do
    call expect(fulgor_train(model, c_loc(x), FULGOR_FLOAT32, x_shape, 2_c_int32_t, c_loc(y), FULGOR_FLOAT32, &
                             y_shape, 2_c_int32_t, loss))
    if (step == 1) first = loss
  end do
  print '(a, es10.3, a, es10.3)', "loss ", first, " -> ", loss

  call expect(fulgor_predict(model, c_loc(x), FULGOR_FLOAT32, x_shape, 2_c_int32_t, c_loc(predicted), &
                             FULGOR_FLOAT32, y_shape, 2_c_int32_t))
  print '(a, es10.3)', "mean squared error of the last batch ", sum((predicted - y) ** 2) / rows
  call expect(fulgor_save(model, c_string(checkpoint)))
  call fulgor_model_destroy(model)
  if (.not. (loss < first / 4)) then
    print *, "the loss did not fall"
    stop 1
  end if

contains

  subroutine expect(status)
    integer(c_int), intent(in) :: status
    if (status /= FULGOR_OK) then
      print '(a, i0, a, a)', "fulgor error ", status, ": ", fulgor_error()
      stop 1
    end if
  end subroutine
end program train
