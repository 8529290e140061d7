package spendbus

# seed 001's policy: a job over its ceiling waits for a person; everything else as checked
default decision := "allow"

decision := "approval" if { input.job_over_budget }
