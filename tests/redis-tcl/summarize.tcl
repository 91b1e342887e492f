# Reads the output of Redis's runtest and decides whether bucketd passed.
#
# Usage: tclsh summarize.tcl LOG SKIP_FILE PENDING_FILE PENDING_MODE UNITS RUNTEST_STATUS FULL
#   PENDING_MODE  "skip": pending tests were passed to runtest as skipped;
#                 "run": they ran, and their failures are expected
#   UNITS         how many units runtest was asked to run
#   FULL          1 when every unit and test ran, so list entries that matched nothing are stale
#
# Prints every failure with its detail, the counts, and as its last line
# "N passed, N failed, N skipped". Exits 0 only when no test outside the two lists failed,
# every unit ran to its end, and runtest's own status agrees.

lassign $argv log_file skip_file pending_file pending_mode units runtest_status full

# The entries of a list file: one a line, '#' comments and blank lines left out.
proc entries {file} {
    set fd [open $file r]
    set out {}
    foreach line [split [read $fd] "\n"] {
        set line [string trimright $line "\r"]
        if {$line eq "" || [string index $line 0] eq "#"} continue
        lappend out $line
    }
    close $fd
    return $out
}

# The pattern of `patterns` that `name` matches, or "": the rule of runtest's
# search_pattern_list (tests/support/test.tcl), an exact name or a /regex/.
proc matching {name patterns} {
    foreach p $patterns {
        if {[string index $p 0] eq "/"} {
            if {[regexp -- [string range $p 1 end] $name]} { return $p }
        } elseif {$p eq $name} {
            return $p
        }
    }
    return ""
}

set skip [entries $skip_file]
set pending [entries $pending_file]

set fd [open $log_file r]
fconfigure $fd -encoding binary -translation auto
set lines [split [read $fd] "\n"]
close $fd

set passed {}       ;# names of passing tests
set failures {}     ;# {name file detail} of failing tests
set skipped {}      ;# names runtest skipped because a list named them
set ignored 0       ;# tests and blocks runtest left out by tag or external mode
set done 0          ;# units that ran to their end
set exceptions {}
set current ""

foreach line $lines {
    regsub -all {\x1b\[[0-9;]*m} $line "" line
    if {[regexp {^\[ok\]: (.*) \([0-9]+ ms\)$} $line -> name]} {
        lappend passed $name
        set current ""
    } elseif {[regexp {^\[err\]: (.*)$} $line -> rest]} {
        # A failing test reads "NAME in tests/unit/x.tcl"; an error outside any test (which
        # ends its block early) has only the message.
        if {![regexp {^(.*) in (tests/\S+\.tcl)$} $rest -> name file]} {
            set name $rest
            set file ""
        }
        lappend failures [list $name $file {}]
        set current [expr {[llength $failures] - 1}]
    } elseif {[regexp {^\[skip\]: (.*)$} $line -> name]} {
        lappend skipped $name
        set current ""
    } elseif {[regexp {^\[ignore\]: } $line]} {
        incr ignored
        set current ""
    } elseif {[regexp {^\[exception\]: (.*)$} $line -> rest]} {
        lappend exceptions $rest
        set current ""
    } elseif {[regexp {^\[[0-9]+/[0-9]+ done\]: } $line]} {
        incr done
        set current ""
    } elseif {[regexp {^(\[|Testing |\*\*\* |Cleanup:|\s+The End)} $line]} {
        set current ""
    } elseif {$current ne "" && [string trim $line] ne ""} {
        set f [lindex $failures $current]
        set detail [lindex $f 2]
        if {[llength $detail] < 8} {
            lappend detail [string range $line 0 400]
            lset failures $current 2 $detail
        }
    }
}

set real {}
set pending_failed 0
set pending_passed {}
foreach f $failures {
    if {$pending_mode eq "run" && [matching [lindex $f 0] $pending] ne ""} {
        incr pending_failed
    } else {
        lappend real $f
    }
}
if {$pending_mode eq "run"} {
    foreach name $passed {
        if {[matching $name $pending] ne ""} { lappend pending_passed $name }
    }
}

set by_design 0
set by_pending 0
set seen {}
foreach name $skipped {
    set p [matching $name $skip]
    if {$p ne ""} {
        incr by_design
    } else {
        set p [matching $name $pending]
        incr by_pending
    }
    dict set seen $p 1
}
set failed_names {}
foreach f $failures { lappend failed_names [lindex $f 0] }
foreach name [concat $passed $failed_names] {
    foreach p [concat [list [matching $name $skip]] [list [matching $name $pending]]] {
        if {$p ne ""} { dict set seen $p 1 }
    }
}

foreach f $real {
    lassign $f name file detail
    if {$file ne ""} {
        puts "FAILED: $name ($file)"
    } else {
        puts "FAILED outside a test (the rest of its block did not run): $name"
    }
    foreach d $detail { puts "    $d" }
}
foreach e $exceptions {
    puts "EXCEPTION (runtest stopped): $e"
}

set stale {}
foreach p [concat $skip $pending] {
    if {![dict exists $seen $p]} { lappend stale $p }
}
if {$full && [llength $stale]} {
    puts "warning: [llength $stale] list entries match no test that ran or was skipped:"
    foreach p $stale { puts "    $p" }
}

if {$pending_mode eq "run"} {
    puts "pending: [llength $pending] entries in pending.txt; $pending_failed of their tests still fail,\
          [llength $pending_passed] pass now"
    foreach name $pending_passed { puts "    passes now, remove from pending.txt: $name" }
} else {
    puts "pending: $by_pending tests skipped as pending ([llength $pending] entries in pending.txt)"
}
puts "skipped: $by_design by design (skip.txt), $by_pending pending (pending.txt),\
      $ignored by tag or external mode"

set ok 1
if {[llength $real] || [llength $exceptions]} { set ok 0 }
if {$done != $units} {
    puts "only $done of $units units ran to their end"
    set ok 0
}
if {$runtest_status != 0 && [llength $failures] == 0} {
    puts "runtest exited with status $runtest_status without reporting a failed test"
    set ok 0
}
if {[llength $passed] == 0} {
    puts "no test passed: the suite did not run"
    set ok 0
}

set total_skipped [expr {$by_design + $by_pending + $ignored}]
puts "[llength $passed] passed, [llength $real] failed, $total_skipped skipped"
exit [expr {$ok ? 0 : 1}]
