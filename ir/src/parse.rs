//! Parser for the text form printed by `print`. Errors carry `line:column`.

use crate::{
    Attr, DType, FuncResult, Function, Instr, Module, Op, Param, ParamRole, ResultRole, SourceLayout, TensorType,
    ValueId, WeightDecl,
};
use std::collections::HashMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IR text {}:{}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for ParseError {}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Value(String),  // %name
    Symbol(String), // @name
    Word(String),   // identifiers, element types, keywords
    Number(String), // integer or float literal as written
    Str(String),
    Punct(char), // ( ) { } [ ] , : =
    Arrow,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Value(s) => write!(f, "`%{s}`"),
            Tok::Symbol(s) => write!(f, "`@{s}`"),
            Tok::Word(s) | Tok::Number(s) => write!(f, "`{s}`"),
            Tok::Str(s) => write!(f, "{s:?}"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    col: usize,
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
}

impl<'a> Lexer<'a> {
    fn err(&self, message: String) -> ParseError {
        ParseError { line: self.line, col: self.col, message }
    }

    /// The rest of a string literal after its opening quote, with the escapes Rust's `{:?}` writes
    /// (the printer's form): `\\`, `\"`, `\'`, `\0`, `\n`, `\r`, `\t` and `\u{HEX}`.
    fn string(&mut self) -> Result<String, ParseError> {
        let mut bytes = Vec::new();
        loop {
            if self.pos >= self.src.len() {
                return Err(self.err("unterminated string".into()));
            }
            match self.bump() {
                b'"' => break,
                b'\\' if self.pos < self.src.len() => {
                    let c = match self.bump() {
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'0' => '\0',
                        b'u' => self.unicode_escape()?,
                        c @ (b'\\' | b'"' | b'\'') => c as char,
                        other => return Err(self.err(format!("unknown escape of {:?} in a string", other as char))),
                    };
                    bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                other => bytes.push(other),
            }
        }
        // The source is a `str` and escapes add whole characters, so the bytes are UTF-8.
        String::from_utf8(bytes).map_err(|_| self.err("a string that is not UTF-8".into()))
    }

    /// `{HEX}` after `\u`.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let rest = &self.src[self.pos..];
        let end = rest.iter().position(|&b| b == b'}');
        let hex = match (rest.first(), end) {
            (Some(b'{'), Some(end)) => std::str::from_utf8(&rest[1..end]).ok(),
            _ => None,
        };
        match hex.and_then(|h| u32::from_str_radix(h, 16).ok()).and_then(char::from_u32) {
            Some(c) => {
                self.pos += end.unwrap() + 1;
                Ok(c)
            }
            None => Err(self.err("expected `{HEX}` (a Unicode scalar value) after `\\u`".into())),
        }
    }

    fn bump(&mut self) -> u8 {
        let c = self.src[self.pos];
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        c
    }

    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> String {
        let start = self.pos;
        while self.pos < self.src.len() && f(self.src[self.pos]) {
            self.bump();
        }
        String::from_utf8_lossy(&self.src[start..self.pos]).into_owned()
    }

    fn tokens(mut self) -> Result<Vec<(Tok, usize, usize)>, ParseError> {
        let mut out = Vec::new();
        loop {
            while self.pos < self.src.len() {
                let c = self.src[self.pos];
                if c.is_ascii_whitespace() {
                    self.bump();
                } else if c == b'/' && self.src.get(self.pos + 1) == Some(&b'/') {
                    self.take_while(|c| c != b'\n');
                } else {
                    break;
                }
            }
            let (line, col) = (self.line, self.col);
            if self.pos >= self.src.len() {
                out.push((Tok::Eof, line, col));
                return Ok(out);
            }
            let c = self.src[self.pos];
            let tok = match c {
                b'%' | b'@' => {
                    self.bump();
                    let name = self.take_while(is_name_char);
                    if name.is_empty() {
                        return Err(self.err(format!("expected a name after `{}`", c as char)));
                    }
                    if c == b'%' {
                        Tok::Value(name)
                    } else {
                        Tok::Symbol(name)
                    }
                }
                b'"' => {
                    self.bump();
                    Tok::Str(self.string()?)
                }
                b'-' if self.src.get(self.pos + 1) == Some(&b'>') => {
                    self.bump();
                    self.bump();
                    Tok::Arrow
                }
                b'-' | b'+' | b'0'..=b'9' => {
                    let sign = if c == b'-' || c == b'+' { (self.bump() as char).to_string() } else { String::new() };
                    let body = self.take_while(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-' || c == b'+');
                    Tok::Number(sign + &body)
                }
                c if c.is_ascii_alphabetic() || c == b'_' => Tok::Word(self.take_while(is_name_char)),
                b'(' | b')' | b'{' | b'}' | b'[' | b']' | b',' | b':' | b'=' => Tok::Punct(self.bump() as char),
                other => return Err(self.err(format!("unexpected character `{}`", other as char))),
            };
            out.push((tok, line, col));
        }
    }
}

struct Parser {
    toks: Vec<(Tok, usize, usize)>,
    i: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.i].0
    }

    fn err<T>(&self, message: String) -> Result<T, ParseError> {
        self.err_at(self.i, message)
    }

    fn err_at<T>(&self, token: usize, message: String) -> Result<T, ParseError> {
        let (_, line, col) = self.toks[token];
        Err(ParseError { line, col, message })
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.i].0.clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, c: char) -> Result<(), ParseError> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            self.err(format!("expected `{c}`, found {}", self.peek()))
        }
    }

    fn expect_word(&mut self, w: &str) -> Result<(), ParseError> {
        match self.peek() {
            Tok::Word(s) if s == w => {
                self.next();
                Ok(())
            }
            other => self.err(format!("expected `{w}`, found {other}")),
        }
    }

    fn word(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Word(s) => {
                self.next();
                Ok(s)
            }
            other => self.err(format!("expected a name, found {other}")),
        }
    }

    fn symbol(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Symbol(s) => {
                self.next();
                Ok(s)
            }
            other => self.err(format!("expected `@name`, found {other}")),
        }
    }

    fn usize(&mut self) -> Result<usize, ParseError> {
        match self.peek().clone() {
            Tok::Number(s) => match s.parse() {
                Ok(v) => {
                    self.next();
                    Ok(v)
                }
                Err(_) => self.err(format!("expected a non-negative integer, found `{s}`")),
            },
            other => self.err(format!("expected an integer, found {other}")),
        }
    }

    fn number(&mut self) -> Result<f64, ParseError> {
        let text = match self.peek().clone() {
            Tok::Number(s) | Tok::Word(s) => s,
            other => return self.err(format!("expected a number, found {other}")),
        };
        match text.parse::<f64>() {
            Ok(v) => {
                self.next();
                Ok(v)
            }
            Err(_) => self.err(format!("expected a number, found `{text}`")),
        }
    }

    fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        let name = self.word()?;
        let dtype: DType = match name.parse() {
            Ok(d) => d,
            Err(e) => {
                self.i -= 1;
                return self.err(e);
            }
        };
        self.expect_punct('[')?;
        let mut shape = Vec::new();
        if !self.eat_punct(']') {
            loop {
                shape.push(self.usize()?);
                if self.eat_punct(']') {
                    break;
                }
                self.expect_punct(',')?;
            }
        }
        // Element counts are multiplied everywhere downstream; bound them where the text enters.
        if let Err(e) = g4c_util::limits::tensor_elements(&shape) {
            return self.err(e);
        }
        Ok(TensorType::new(dtype, shape))
    }

    fn attr_value(&mut self) -> Result<Attr, ParseError> {
        match self.peek().clone() {
            Tok::Punct('[') => {
                self.next();
                let mut texts = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        match self.peek().clone() {
                            Tok::Number(s) | Tok::Word(s) => texts.push(s),
                            other => return self.err(format!("expected a number, found {other}")),
                        }
                        self.number()?;
                        if self.eat_punct(']') {
                            break;
                        }
                        self.expect_punct(',')?;
                    }
                }
                let list = || format!("[{}]", texts.join(", "));
                if texts.iter().all(|t| is_integer(t)) {
                    match texts.iter().map(|t| t.parse()).collect() {
                        Ok(ints) => Ok(Attr::Ints(ints)),
                        Err(_) => self.err(format!("expected integers below 2^64, found {}", list())),
                    }
                } else {
                    match texts.iter().map(|t| t.parse()).collect() {
                        Ok(floats) => Ok(Attr::Floats(floats)),
                        Err(_) => self.err(format!("expected numbers, found {}", list())),
                    }
                }
            }
            Tok::Number(s) if is_integer(&s) => Ok(Attr::Int(self.usize()?)),
            Tok::Number(_) => Ok(Attr::Float(self.number()?)),
            Tok::Word(w) if matches!(w.as_str(), "inf" | "nan") => Ok(Attr::Float(self.number()?)),
            Tok::Word(w) => {
                self.next();
                Ok(Attr::Word(w))
            }
            other => self.err(format!("expected an attribute value, found {other}")),
        }
    }

    fn module(&mut self) -> Result<Module, ParseError> {
        self.expect_word("module")?;
        let mut m = Module::new(self.symbol()?);
        self.expect_punct('{')?;
        loop {
            match self.peek().clone() {
                Tok::Word(w) if w == "weight" => {
                    self.next();
                    let name = self.symbol()?;
                    self.expect_punct(':')?;
                    let ty = self.tensor_type()?;
                    self.expect_punct('=')?;
                    let source = match self.next() {
                        Tok::Str(s) => s,
                        other => {
                            self.i -= 1;
                            return self.err(format!("expected the weight's source key as a string, found {other}"));
                        }
                    };
                    let layout = match self.peek().clone() {
                        Tok::Word(w)
                            if SourceLayout::from_word(&w, None).is_some() || SourceLayout::takes_group(&w) =>
                        {
                            self.next();
                            let group = if SourceLayout::takes_group(&w) {
                                self.expect_punct('(')?;
                                let g = self.usize()?;
                                self.expect_punct(')')?;
                                Some(g)
                            } else {
                                None
                            };
                            SourceLayout::from_word(&w, group).expect("a layout word")
                        }
                        _ => SourceLayout::Stored,
                    };
                    m.weights.push(WeightDecl { name, ty, source, layout });
                }
                Tok::Word(w) if w == "func" => {
                    self.next();
                    let f = self.function()?;
                    m.functions.push(f);
                }
                Tok::Punct('}') => {
                    self.next();
                    break;
                }
                other => return self.err(format!("expected `weight`, `func` or `}}`, found {other}")),
            }
        }
        if *self.peek() != Tok::Eof {
            return self.err(format!("expected end of input after the module, found {}", self.peek()));
        }
        Ok(m)
    }

    fn function(&mut self) -> Result<Function, ParseError> {
        let mut f = Function::new(self.symbol()?);
        let mut scope: HashMap<String, ValueId> = HashMap::new();
        self.expect_punct('(')?;
        if !self.eat_punct(')') {
            loop {
                let name = match self.next() {
                    Tok::Value(n) => n,
                    other => {
                        self.i -= 1;
                        return self.err(format!("expected a parameter `%name`, found {other}"));
                    }
                };
                self.expect_punct(':')?;
                let ty = self.tensor_type()?;
                let role = self.param_role(&scope)?;
                let value = self.define(&mut f, &mut scope, &name, ty)?;
                f.params.push(Param { value, role });
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',')?;
            }
        }
        if self.next() != Tok::Arrow {
            self.i -= 1;
            return self.err(format!("expected `->`, found {}", self.peek()));
        }
        self.expect_punct('(')?;
        let mut result_sig = Vec::new();
        if !self.eat_punct(')') {
            loop {
                let name = self.word()?;
                self.expect_punct(':')?;
                let ty = self.tensor_type()?;
                let role = match self.peek() {
                    Tok::Word(w) if w == "logits" => {
                        self.next();
                        ResultRole::Logits
                    }
                    Tok::Word(w) if w == "greedy_tokens" => {
                        self.next();
                        ResultRole::GreedyTokens
                    }
                    // A result named like a state parameter is that state's next value.
                    _ if f.param(&name).is_some_and(|p| p.role.is_state()) => ResultRole::NextState,
                    _ => ResultRole::Output,
                };
                result_sig.push((name, ty, role));
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',')?;
            }
        }
        self.expect_punct('{')?;
        loop {
            match self.next() {
                Tok::Value(name) => {
                    self.expect_punct('=')?;
                    let mnemonic_at = self.i;
                    let mnemonic = self.word()?;
                    let symbol = if matches!(self.peek(), Tok::Symbol(_)) { Some(self.symbol()?) } else { None };
                    let mut operands = Vec::new();
                    while let Tok::Value(v) = self.peek().clone() {
                        operands.push(self.lookup(&scope, &v)?);
                        self.next();
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    let mut attrs = Vec::new();
                    if self.eat_punct('{') {
                        loop {
                            let key = self.word()?;
                            self.expect_punct('=')?;
                            attrs.push((key, self.attr_value()?));
                            if self.eat_punct('}') {
                                break;
                            }
                            self.expect_punct(',')?;
                        }
                    }
                    self.expect_punct(':')?;
                    let ty = self.tensor_type()?;
                    let op = match Op::from_parts(&mnemonic, symbol, operands, attrs) {
                        Ok(op) => op,
                        Err(e) => return self.err_at(mnemonic_at, format!("%{name}: {e}")),
                    };
                    let result = self.define(&mut f, &mut scope, &name, ty)?;
                    f.body.push(Instr { result, op });
                }
                Tok::Word(w) if w == "return" => {
                    let return_at = self.i - 1;
                    let mut values = Vec::new();
                    while let Tok::Value(v) = self.peek().clone() {
                        values.push(self.lookup(&scope, &v)?);
                        self.next();
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    if values.len() != result_sig.len() {
                        return self.err_at(
                            return_at,
                            format!(
                                "return has {} value(s), the signature declares {}",
                                values.len(),
                                result_sig.len()
                            ),
                        );
                    }
                    for ((name, ty, role), value) in result_sig.iter().zip(&values) {
                        if f.ty(*value) != ty {
                            return self.err_at(
                                return_at,
                                format!("result `{name}` is declared {ty} but returns {}", f.ty(*value)),
                            );
                        }
                        f.results.push(FuncResult { name: name.clone(), value: *value, role: *role });
                    }
                    self.expect_punct('}')?;
                    return Ok(f);
                }
                other => {
                    self.i -= 1;
                    return self.err(format!("expected an instruction or `return`, found {other}"));
                }
            }
        }
    }

    /// The role written after a parameter's type (`Input` when none is).
    fn param_role(&mut self, scope: &HashMap<String, ValueId>) -> Result<ParamRole, ParseError> {
        let Tok::Word(word) = self.peek().clone() else { return Ok(ParamRole::Input) };
        let at = self.i;
        let role = match word.as_str() {
            "token_ids" => ParamRole::TokenIds,
            "positions" => ParamRole::Positions,
            "last_index" => ParamRole::LastIndex,
            "kv_cache" | "slot_positions" | "host_gather" | "state" => {
                self.next();
                self.expect_punct('(')?;
                let role = match word.as_str() {
                    "kv_cache" => {
                        let layer = self.usize()?;
                        self.expect_punct(',')?;
                        let part = self.word()?.parse().or_else(|e| self.err_at(at, e))?;
                        ParamRole::KvCache { layer, part }
                    }
                    "slot_positions" => ParamRole::SlotPositions(self.word()?.parse().or_else(|e| self.err_at(at, e))?),
                    "host_gather" => {
                        let table = self.symbol()?;
                        self.expect_punct(',')?;
                        let indices = match self.next() {
                            Tok::Value(v) => self.lookup(scope, &v)?,
                            other => {
                                self.i -= 1;
                                return self.err(format!("expected the `%indices` parameter, found {other}"));
                            }
                        };
                        ParamRole::HostGather { table, indices }
                    }
                    _ => ParamRole::State { init: self.number()? },
                };
                self.expect_punct(')')?;
                return Ok(role);
            }
            _ => return Ok(ParamRole::Input),
        };
        self.next();
        Ok(role)
    }

    fn define(
        &self,
        f: &mut Function,
        scope: &mut HashMap<String, ValueId>,
        name: &str,
        ty: TensorType,
    ) -> Result<ValueId, ParseError> {
        if scope.contains_key(name) {
            return self.err(format!("%{name} is defined twice"));
        }
        let printed_name = if name.chars().all(|c| c.is_ascii_digit()) { None } else { Some(name.to_string()) };
        let v = f.new_value(ty, printed_name);
        scope.insert(name.to_string(), v);
        Ok(v)
    }

    fn lookup(&self, scope: &HashMap<String, ValueId>, name: &str) -> Result<ValueId, ParseError> {
        match scope.get(name) {
            Some(v) => Ok(*v),
            None => self.err(format!("%{name} is used before it is defined")),
        }
    }
}

fn is_integer(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_digit())
}

/// Parses a module from its text form. Types are read as written; call `verify_module` to check them.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    let toks = Lexer { src: text.as_bytes(), pos: 0, line: 1, col: 1 }.tokens()?;
    Parser { toks, i: 0 }.module()
}
