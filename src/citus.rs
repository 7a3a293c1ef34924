//! Under Citus: refuse a NULL scope before Citus plans the call.
//!
//! Once `idem_distribute` registered the consumer functions as distributed functions delegated by
//! `scope`, Citus' planner hashes the scope argument of a call such as `SELECT idem_once('k', NULL)` to
//! find the worker to send it to, and Citus 13.2.2 does not check it for NULL: the coordinator's
//! backend dies of a segmentation fault, and the postmaster restarts every session with it. The
//! function itself would have raised 22004, but it never runs. So, when Citus is loaded, the library
//! puts a planner hook in front of Citus' own: a top-level `SELECT` that calls one of those functions
//! with a NULL scope (a NULL constant, or a bound parameter whose value is NULL) gets the function's own
//! error, `22004 idempotency: scope must not be NULL`, before any planning. Any expression that folds to
//! NULL counts (`NULL::name`, `nullif('x', 'x')`, a `CASE` without a match): the hook folds the scope
//! argument as the planner would before looking. Without Citus no hook is
//! installed and nothing changes.
use crate::errors;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_char, c_int, CStr};

/// The functions Citus delegates by scope, each with the position of its `scope` argument (0-based):
/// what `idem_distribute` registers (it reads them through `idempotency.delegated_functions()`) and
/// what the planner hook guards. idem_record_offset, idem_next_offset, idem_offsets and
/// idem_reset_offset are not among them: offsets stay on the coordinator (docs/scaling-out.md). The
/// admin's redrive and forget are, so that they reach the key's worker through the coordinator too.
pub const DELEGATED: [(&str, usize); 12] = [
    ("idem_claim(text, interval, text, text, boolean)", 2),
    ("idem_complete(text, jsonb, text, bigint)", 2),
    ("idem_fail(text, jsonb, boolean, text, bigint)", 3),
    ("idem_heartbeat(text, interval, text, bigint)", 2),
    ("idem_once(text, text)", 1),
    ("idem_status(text, text)", 1),
    ("idem_claim_batch(text[], interval, text)", 2),
    ("idem_complete_batch(text[], jsonb[], text, bigint[])", 2),
    ("idem_once_batch(text[], text)", 1),
    ("idem_redrive(text, text)", 1),
    ("idem_redrive_scope(text, timestamp with time zone, integer)", 0),
    ("idem_forget(text, text)", 1),
];

/// A delegated function's name and number of arguments, from its signature.
fn name_and_arity(signature: &str) -> (&str, usize) {
    let (name, args) = signature.split_once('(').expect("a signature");
    (name, if args == ")" { 0 } else { args.matches(',').count() + 1 })
}

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

/// Installs the planner hook when Citus is loaded in this process (it must be preloaded, and first in
/// `shared_preload_libraries`, so it is loaded before this library whenever it is used).
pub fn init() {
    // SAFETY: looks a GUC up by a valid C string; missing_ok = true returns NULL for an unknown one.
    let citus = unsafe { pg_sys::GetConfigOption(c"citus.version".as_ptr(), true, false) };
    if citus.is_null() {
        return;
    }
    // SAFETY: _PG_init runs once per process before any query is planned; the previous hook (Citus')
    // is kept and called by ours, as every planner hook does.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
    }
}

/// # Safety
/// Called by PostgreSQL's planner only, with a valid query tree and bound parameters (or NULL).
#[pg_guard]
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the planner hands a valid Query and parameter list; the walk only reads them.
    unsafe { refuse_null_scope(parse, bound_params) };
    // SAFETY: the saved hook (or the standard planner) with the arguments we were given.
    unsafe {
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// The pointers of a PostgreSQL `List` of pointers.
///
/// # Safety
/// `list` must be NULL or a valid pointer list.
unsafe fn pointers(list: *mut pg_sys::List) -> Vec<*mut std::ffi::c_void> {
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: a valid List has `length` initialized cells, each holding a pointer.
    unsafe { (0..(*list).length as usize).map(|i| (*(*list).elements.add(i)).ptr_value).collect() }
}

/// # Safety
/// `parse` must be a valid Query, `params` NULL or a valid parameter list.
unsafe fn refuse_null_scope(parse: *mut pg_sys::Query, params: pg_sys::ParamListInfo) {
    // SAFETY: reads fields of the valid Query.
    let (command, targets, rtable) = unsafe { ((*parse).commandType, (*parse).targetList, (*parse).rtable) };
    if command != pg_sys::CmdType::CMD_SELECT {
        return;
    }
    // The shapes Citus delegates: SELECT f(...), and SELECT ... FROM f(...).
    // SAFETY: a Query's targetList holds TargetEntry nodes.
    for te in unsafe { pointers(targets) } {
        // SAFETY: te is a TargetEntry.
        unsafe { check_call((*(te as *mut pg_sys::TargetEntry)).expr as *mut pg_sys::Node, params) };
    }
    // SAFETY: a Query's rtable holds RangeTblEntry nodes, a function RTE's `functions` RangeTblFunctions.
    for rte in unsafe { pointers(rtable) } {
        let rte = rte as *mut pg_sys::RangeTblEntry;
        // SAFETY: rte is a RangeTblEntry.
        if unsafe { (*rte).rtekind } != pg_sys::RTEKind::RTE_FUNCTION {
            continue;
        }
        // SAFETY: as above.
        for rtf in unsafe { pointers((*rte).functions) } {
            // SAFETY: rtf is a RangeTblFunction.
            unsafe { check_call((*(rtf as *mut pg_sys::RangeTblFunction)).funcexpr, params) };
        }
    }
}

/// # Safety
/// `node` must be NULL or a valid expression node, `params` NULL or a valid parameter list.
unsafe fn check_call(node: *mut pg_sys::Node, params: pg_sys::ParamListInfo) {
    // SAFETY: every node starts with its tag.
    if node.is_null() || unsafe { (*node).type_ } != pg_sys::NodeTag::T_FuncExpr {
        return;
    }
    let call = node as *mut pg_sys::FuncExpr;
    // SAFETY: call is a FuncExpr; its args a List of expression nodes.
    let (funcid, args) = unsafe { ((*call).funcid, pointers((*call).args)) };
    // SAFETY: a syscache lookup; NULL for an unknown function.
    let name = unsafe { pg_sys::get_func_name(funcid) };
    if name.is_null() {
        return;
    }
    // SAFETY: get_func_name returns a palloc'd NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    let Some((nargs, scope_at)) = DELEGATED.iter().find_map(|&(signature, scope_at)| {
        let (delegated, nargs) = name_and_arity(signature);
        (delegated == name).then_some((nargs, scope_at))
    }) else {
        return;
    };
    // SAFETY: a syscache lookup of an existing function.
    if unsafe { pg_sys::get_func_nargs(funcid) } as usize != nargs {
        return;
    }
    for (i, arg) in args.into_iter().enumerate() {
        let mut arg = arg as *mut pg_sys::Node;
        let mut position = i;
        // SAFETY: arg is an expression node; a NamedArgExpr carries the argument's position.
        unsafe {
            if (*arg).type_ == pg_sys::NodeTag::T_NamedArgExpr {
                let named = arg as *mut pg_sys::NamedArgExpr;
                position = (*named).argnumber as usize;
                arg = (*named).arg as *mut pg_sys::Node;
            }
            while !arg.is_null() && (*arg).type_ == pg_sys::NodeTag::T_RelabelType {
                arg = (*(arg as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node;
            }
        }
        // SAFETY: arg is an expression node, params NULL or valid.
        if position == scope_at && unsafe { is_null_value(arg, params) || folds_to_null(arg, params) } {
            errors::null_argument("scope");
        }
    }
}

/// Whether the expression folds to a NULL constant, as the planner (and Citus after it) folds it: any
/// other spelling of NULL (`NULL::name`, `nullif('x', 'x')`, `CASE WHEN false THEN 'x' END`, a cast of
/// a NULL parameter) reaches Citus' hash as the same NULL constant.
///
/// # Safety
/// `node` must be a valid expression node, `params` NULL or a valid parameter list.
unsafe fn folds_to_null(node: *mut pg_sys::Node, params: pg_sys::ParamListInfo) -> bool {
    // SAFETY: the folding works on a copy in the planner's memory context; a planner root is made only
    // to carry the bound parameters, which is all eval_const_expressions reads of it besides the list
    // of invalidation items it may append to.
    unsafe {
        let root = if params.is_null() {
            std::ptr::null_mut()
        } else {
            let glob = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlannerGlobal>()) as *mut pg_sys::PlannerGlobal;
            (*glob).type_ = pg_sys::NodeTag::T_PlannerGlobal;
            (*glob).boundParams = params;
            let root = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlannerInfo>()) as *mut pg_sys::PlannerInfo;
            (*root).type_ = pg_sys::NodeTag::T_PlannerInfo;
            (*root).glob = glob;
            root
        };
        let copy = pg_sys::copyObjectImpl(node as *const std::ffi::c_void) as *mut pg_sys::Node;
        let mut folded = pg_sys::eval_const_expressions(root, copy);
        while !folded.is_null() && (*folded).type_ == pg_sys::NodeTag::T_RelabelType {
            folded = (*(folded as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node;
        }
        !folded.is_null()
            && (*folded).type_ == pg_sys::NodeTag::T_Const
            && (*(folded as *mut pg_sys::Const)).constisnull
    }
}

/// # Safety
/// `node` must be NULL or a valid expression node, `params` NULL or a valid parameter list.
unsafe fn is_null_value(node: *mut pg_sys::Node, params: pg_sys::ParamListInfo) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: node is an expression node; a Const and a Param are read by their own layout.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Const => (*(node as *mut pg_sys::Const)).constisnull,
            pg_sys::NodeTag::T_Param => {
                let param = node as *mut pg_sys::Param;
                if params.is_null() || (*param).paramkind != pg_sys::ParamKind::PARAM_EXTERN {
                    return false;
                }
                let id = (*param).paramid;
                if id < 1 || id > (*params).numParams {
                    return false;
                }
                // What the planner itself does before it folds a parameter into a constant (and Citus
                // then hashes that constant): fetch it through the hook when there is one (PL/pgSQL).
                let mut workspace = pg_sys::ParamExternData::default();
                let value = match (*params).paramFetch {
                    Some(fetch) => fetch(params, id, false, &mut workspace),
                    None => (*params).params.as_mut_ptr().add(id as usize - 1),
                };
                !value.is_null() && (*value).pflags & pg_sys::PARAM_FLAG_CONST as u16 != 0 && (*value).isnull
            }
            _ => false,
        }
    }
}
