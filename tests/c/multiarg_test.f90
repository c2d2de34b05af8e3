! The multiarg calls from Fortran: tests/c/multiarg_model.py's model of two
! inputs and two outputs, trained with its TorchScript loss from the
! configuration file, gives Python's loss at every step and Python's
! predictions, bit for bit (the check multiarg_test.c makes from C).
!
!   fulgor_fortran_multiarg_test DIR
program multiarg_test
  use iso_c_binding
  use iso_fortran_env, only: error_unit
  use fulgor
  implicit none
  integer, parameter :: rows = 16, steps = 20
  ! Fortran's x(3, rows) is C's x[rows][3]: the shapes passed are reversed.
  real(c_float), target :: x(3, rows), t(2, rows), u(2, rows), v(1, rows)
  real(c_float), target :: want_u(2, rows), want_v(1, rows), got_u(2, rows), got_v(1, rows)
  real(c_double) :: want_losses(steps), loss
  integer(c_int64_t), target :: x_shape(2), t_shape(2), u_shape(2), v_shape(2)
  type(fulgor_tensor) :: inputs(2), labels(2), outputs(2)
  type(c_ptr) :: model
  character(len=4096) :: dir
  integer :: step, failures

  if (command_argument_count() /= 1) then
    write (error_unit, '(a)') "usage: fulgor_fortran_multiarg_test DIR"
    stop 2
  end if
  call get_command_argument(1, dir)
  call read_floats("x.bin", x)
  call read_floats("t.bin", t)
  call read_floats("u.bin", u)
  call read_floats("v.bin", v)
  call read_floats("pred_u.bin", want_u)
  call read_floats("pred_v.bin", want_v)
  open (10, file=trim(dir)//"/losses.bin", access="stream", form="unformatted", status="old")
  read (10) want_losses
  close (10)

  x_shape = [int(rows, c_int64_t), 3_c_int64_t]
  t_shape = [int(rows, c_int64_t), 2_c_int64_t]
  u_shape = [int(rows, c_int64_t), 2_c_int64_t]
  v_shape = [int(rows, c_int64_t), 1_c_int64_t]
  inputs(1) = fulgor_tensor(c_loc(x), FULGOR_FLOAT32, c_loc(x_shape), 2)
  inputs(2) = fulgor_tensor(c_loc(t), FULGOR_FLOAT32, c_loc(t_shape), 2)
  labels(1) = fulgor_tensor(c_loc(u), FULGOR_FLOAT32, c_loc(u_shape), 2)
  labels(2) = fulgor_tensor(c_loc(v), FULGOR_FLOAT32, c_loc(v_shape), 2)
  outputs(1) = fulgor_tensor(c_loc(got_u), FULGOR_FLOAT32, c_loc(u_shape), 2)
  outputs(2) = fulgor_tensor(c_loc(got_v), FULGOR_FLOAT32, c_loc(v_shape), 2)

  call expect(fulgor_model_create_from_file(c_string(trim(dir)//"/model.pt"), c_string(trim(dir)//"/config.json"), &
                                            model))
  failures = 0
  do step = 1, steps
    call expect(fulgor_train_multiarg(model, inputs, 2, labels, 2, loss))
    if (loss /= want_losses(step)) then
      write (error_unit, '(a, i0, a, es25.17, a, es25.17)') "step ", step, ": loss ", loss, ", Python's ", &
          want_losses(step)
      failures = failures + 1
    end if
  end do
  call expect(fulgor_predict_multiarg(model, inputs, 2, outputs, 2))
  if (any(got_u /= want_u) .or. any(got_v /= want_v)) then
    write (error_unit, '(a)') "the predictions differ from Python's"
    failures = failures + 1
  end if
  call fulgor_model_destroy(model)
  if (failures /= 0) stop 1
  print '(a)', "all checks passed"

contains

  subroutine read_floats(name, array)
    character(len=*), intent(in) :: name
    real(c_float), intent(out) :: array(:, :)
    open (10, file=trim(dir)//"/"//name, access="stream", form="unformatted", status="old")
    read (10) array
    close (10)
  end subroutine

  subroutine expect(status)
    integer(c_int), intent(in) :: status
    if (status /= FULGOR_OK) then
      write (error_unit, '(a, i0, a, a)') "status ", status, ": ", fulgor_error()
      stop 1
    end if
  end subroutine
end program
