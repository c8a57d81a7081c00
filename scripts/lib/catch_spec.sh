# shellcheck shell=bash
# catch_spec NAME: a Catch2 test spec that selects the test case named NAME and no other (its characters that a spec
# reads as syntax, \ , [ ] " * ~, escaped with a backslash).
catch_spec() {
    local s=$1 out="" c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
            \\ | , | \[ | \] | \" | \* | \~) out+="\\$c" ;;
            *) out+=$c ;;
        esac
    done
    printf '%s\n' "$out"
}
